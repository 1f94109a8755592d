package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/metrics"
	"github.com/extworker/extworker/migrations"
)

// OpsConfig is the operations endpoint's configuration, read from EXTWORKER_* variables
// beside config (kept apart so the two evolve independently).
type OpsConfig struct {
	// HTTPAddr is where /metrics, /healthz and /readyz (and /debug/pprof/ when enabled)
	// are served. "off" serves nothing. Binding it is a start-up error: a worker nobody
	// can watch should not run unnoticed.
	HTTPAddr string `envconfig:"HTTP_ADDR" default:"127.0.0.1:9464"`
	// Pprof serves net/http/pprof under /debug/pprof/ on HTTPAddr. Off by default: it
	// exposes internals and costs CPU while profiling.
	Pprof bool `envconfig:"PPROF" default:"false"`
	// ReadyTimeout bounds each readiness check (engine, database, migrations).
	ReadyTimeout time.Duration `envconfig:"READY_TIMEOUT" default:"2s"`
}

// LoadOpsConfig reads opsConfig's variables, naming every one that does not parse or is
// out of range (readOpsConfig in config.go; loadConfig lists the same problems beside
// config's, so that one start shows them all). It is a configError: exit status 78.
func LoadOpsConfig() (OpsConfig, error) {
	c, _, errs := ReadOpsConfig()
	if len(errs) > 0 {
		return c, ConfigError{fmt.Errorf("configuration: %w", errors.Join(errs...))}
	}
	return c, nil
}

// NewOpsRegistry returns a private registry (no global state) with the Go runtime's and
// the process's collectors.
func NewOpsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// OpenOpsPool opens a small pool of its own for the readiness checks, so a busy ledger
// pool does not make the worker look unready (and the checks do not take its connections).
func OpenOpsPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	pc, err := DatabaseConfig(dbURL) // TLS verified by default, as the ledger's
	if err != nil {
		return nil, fmt.Errorf("EXTWORKER_DATABASE_URL: %w", err)
	}
	pc.MaxConns = 2
	pc.MinConns = 0
	return pgxpool.NewWithConfig(ctx, pc)
}

// Readiness is /readyz's answer: each check "ok" or what failed.
type Readiness struct {
	Status string            `json:"status"` // ready or not ready
	Checks map[string]string `json:"checks"` // engine, database, migrations
}

// StartOps serves the operations endpoints on cfg.HTTPAddr until stop is called:
//
//	/metrics        Prometheus exposition of gatherer
//	/healthz        200 "ok" while the process serves HTTP (liveness)
//	/readyz         200 when the engine answers GET /version, the ledger database answers
//	                a ping and has every migration of this binary; else 503. Both carry a
//	                JSON body naming each check's result.
//	/debug/pprof/   net/http/pprof, only when cfg.Pprof
//
// It returns the address it listens on (useful with port 0). m, if not nil, counts
// failed readiness checks as engine and database errors. stop shuts the server down,
// waiting up to 5s for requests in flight; it is safe to call twice.
func StartOps(ctx context.Context, cfg OpsConfig, gatherer prometheus.Gatherer, c *camunda7.Client, pool *pgxpool.Pool,
	m *metrics.Metrics, logger *slog.Logger) (addr string, stop func(), err error) {
	if cfg.HTTPAddr == "off" {
		logger.Info("operations endpoint off (EXTWORKER_HTTP_ADDR=off)")
		return "", func() {}, nil
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 2 * time.Second
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		res := checkReady(r.Context(), cfg.ReadyTimeout, c, pool, m)
		w.Header().Set("Content-Type", "application/json")
		if res.Status != "ready" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(res)
	})
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.HTTPAddr)
	if err != nil {
		// A second worker on one host meets the first one's default address here.
		return "", nil, fmt.Errorf("operations endpoint on EXTWORKER_HTTP_ADDR=%s: %w: set EXTWORKER_HTTP_ADDR to a free address "+
			"(one per worker on a host), or EXTWORKER_HTTP_ADDR=off to serve no /metrics, /healthz and /readyz", cfg.HTTPAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, BaseContext: func(net.Listener) context.Context {
		return context.WithoutCancel(ctx)
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("operations endpoint stopped", slog.Any("error", err))
		}
	}()
	addr = ln.Addr().String()
	logger.Info("operations endpoint listening", slog.String("addr", addr), slog.Bool("pprof", cfg.Pprof))
	var once sync.Once
	return addr, func() {
		once.Do(func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				_ = srv.Close()
			}
			<-done
		})
	}, nil
}

// checkReady runs the readiness checks concurrently, each bounded by timeout.
func checkReady(ctx context.Context, timeout time.Duration, c *camunda7.Client, pool *pgxpool.Pool, m *metrics.Metrics) Readiness {
	res := Readiness{Status: "ready", Checks: map[string]string{}}
	var mu sync.Mutex
	record := func(check string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			res.Status = "not ready"
			res.Checks[check] = err.Error()
			return
		}
		res.Checks[check] = "ok"
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := c.Version(cctx)
		if err != nil && m != nil {
			m.EngineError("version", err)
		}
		record("engine", err)
	})
	wg.Go(func() {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := pool.Ping(cctx); err != nil {
			if m != nil {
				m.DatabaseError("ping", err)
			}
			record("database", err)
			record("migrations", errors.New("not checked: database unreachable"))
			return
		}
		record("database", nil)
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		err := migrations.Check(cctx, db)
		if err != nil && m != nil {
			m.DatabaseError("migrations", err)
		}
		record("migrations", err)
	})
	wg.Wait()
	return res
}
