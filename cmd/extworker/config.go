package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/kelseyhightower/envconfig"
	"github.com/lmittmann/tint"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/migrations"
	"github.com/extworker/extworker/tasks"
)

// config is the daemon's configuration, read from EXTWORKER_* variables.
type config struct {
	EngineURL      string        `envconfig:"ENGINE_URL" default:"http://127.0.0.1:8080/engine-rest"`
	EngineUser     string        `envconfig:"ENGINE_USER"`
	EnginePassword string        `envconfig:"ENGINE_PASSWORD"`
	EngineToken    string        `envconfig:"ENGINE_TOKEN"`
	EngineCAFile   string        `envconfig:"ENGINE_CA_FILE"`
	EngineCertFile string        `envconfig:"ENGINE_CERT_FILE"`
	EngineKeyFile  string        `envconfig:"ENGINE_KEY_FILE"`
	EngineTimeout  time.Duration `envconfig:"ENGINE_TIMEOUT" default:"30s"`

	// DatabaseURL is the ledger's PostgreSQL (pgx URL; TLS with sslmode=verify-full and
	// sslrootcert=..., client certificates with sslcert/sslkey).
	DatabaseURL     string        `envconfig:"DATABASE_URL" default:"postgres://extworker:extworker@127.0.0.1:5432/extworker"`
	LedgerNamespace string        `envconfig:"LEDGER_NAMESPACE" default:"default"`
	LedgerLease     time.Duration `envconfig:"LEDGER_LEASE" default:"2m"`
	// LedgerRetention is how long settled intents are kept; `run` prunes older ones hourly.
	// Unknown and held intents are never pruned. 0 keeps everything.
	LedgerRetention time.Duration `envconfig:"LEDGER_RETENTION" default:"720h"`
	// ProviderURL is the demo topics' payment provider; empty starts a fake one in-process.
	ProviderURL string `envconfig:"PROVIDER_URL"`

	WorkerID       string        `envconfig:"WORKER_ID"`
	MaxConcurrency int           `envconfig:"MAX_CONCURRENCY" default:"16"`
	LongPoll       time.Duration `envconfig:"LONG_POLL" default:"20s"`
	LockDuration   time.Duration `envconfig:"LOCK_DURATION" default:"20s"`
	ShutdownGrace  time.Duration `envconfig:"SHUTDOWN_GRACE" default:"30s"`

	LogFormat string `envconfig:"LOG_FORMAT" default:"auto"` // auto (text on a terminal, else JSON), text, json
	LogLevel  string `envconfig:"LOG_LEVEL" default:"info"`  // debug, info, warn, error
}

func loadConfig() (config, error) {
	var c config
	if err := envconfig.Process("extworker", &c); err != nil {
		return c, fmt.Errorf("configuration: %w", err)
	}
	return c, c.validate()
}

// validate lists every problem at once.
func (c config) validate() error {
	var errs []error
	switch c.LogFormat {
	case "auto", "text", "json":
	default:
		errs = append(errs, fmt.Errorf("EXTWORKER_LOG_FORMAT %q: want auto, text or json", c.LogFormat))
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		errs = append(errs, fmt.Errorf("EXTWORKER_LOG_LEVEL %q: want debug, info, warn or error", c.LogLevel))
	}
	if (c.EngineCertFile == "") != (c.EngineKeyFile == "") {
		errs = append(errs, errors.New("EXTWORKER_ENGINE_CERT_FILE and EXTWORKER_ENGINE_KEY_FILE must be set together"))
	}
	if c.MaxConcurrency < 1 {
		errs = append(errs, fmt.Errorf("EXTWORKER_MAX_CONCURRENCY %d: must be at least 1", c.MaxConcurrency))
	}
	if c.LedgerRetention < 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_LEDGER_RETENTION %v: must not be negative", c.LedgerRetention))
	}
	if c.LedgerLease < time.Second {
		errs = append(errs, fmt.Errorf("EXTWORKER_LEDGER_LEASE %v: must be at least 1s", c.LedgerLease))
	}
	if c.LockDuration < time.Second {
		errs = append(errs, fmt.Errorf("EXTWORKER_LOCK_DURATION %v: must be at least 1s", c.LockDuration))
	}
	if c.LongPoll < 0 || c.LongPoll > camunda7.MaxAsyncResponseTimeout {
		errs = append(errs, fmt.Errorf("EXTWORKER_LONG_POLL %v: must be between 0 and 30m", c.LongPoll))
	}
	if len(errs) > 0 {
		return fmt.Errorf("configuration: %w", errors.Join(errs...))
	}
	return nil
}

func newLogger(c config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.LogLevel))
	format := c.LogFormat
	if format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				format = "text"
			}
		}
	}
	if format == "text" {
		return slog.New(tint.NewHandler(w, &tint.Options{Level: lvl, TimeFormat: time.TimeOnly}))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl}))
}

func newClient(c config, logger *slog.Logger) (*camunda7.Client, error) {
	cc := camunda7.Config{BaseURL: c.EngineURL, Username: c.EngineUser, Password: c.EnginePassword,
		BearerToken: c.EngineToken, Timeout: c.EngineTimeout, Logger: logger}
	if c.EngineCAFile != "" || c.EngineCertFile != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.EngineCAFile != "" {
			pem, err := os.ReadFile(c.EngineCAFile)
			if err != nil {
				return nil, fmt.Errorf("EXTWORKER_ENGINE_CA_FILE: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("EXTWORKER_ENGINE_CA_FILE %s: no PEM certificates", c.EngineCAFile)
			}
		}
		if c.EngineCertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.EngineCertFile, c.EngineKeyFile)
			if err != nil {
				return nil, fmt.Errorf("EXTWORKER_ENGINE_CERT_FILE/KEY_FILE: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		cc.TLS = tc
	}
	return camunda7.New(cc)
}

// openLedger connects to the ledger database and checks it is migrated (unless migrating
// is what the caller is about to do).
func openLedger(ctx context.Context, c config, logger *slog.Logger, requireMigrated bool) (*idempotency.Ledger, *pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, c.DatabaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("EXTWORKER_DATABASE_URL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("ledger database at %s: %w", redactedURL(c.DatabaseURL), err)
	}
	if requireMigrated {
		db := stdlib.OpenDBFromPool(pool)
		err := migrations.Check(ctx, db)
		db.Close()
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
	}
	l, err := idempotency.New(pool, idempotency.Config{Namespace: c.LedgerNamespace, Lease: c.LedgerLease, Logger: logger})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return l, pool, nil
}

// migrate applies the ledger's migrations.
func migrate(ctx context.Context, c config, out io.Writer) error {
	pool, err := pgxpool.New(ctx, c.DatabaseURL)
	if err != nil {
		return fmt.Errorf("EXTWORKER_DATABASE_URL: %w", err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	applied, err := migrations.Up(ctx, db)
	if err != nil {
		return fmt.Errorf("ledger database at %s: %w", redactedURL(c.DatabaseURL), err)
	}
	if len(applied) == 0 {
		fmt.Fprintln(out, "ledger database is up to date")
		return nil
	}
	fmt.Fprintf(out, "applied migrations %v\n", applied)
	return nil
}

func (c config) workerConfig(logger *slog.Logger) tasks.Config {
	return tasks.Config{WorkerID: c.WorkerID, MaxConcurrency: c.MaxConcurrency, AsyncResponseTimeout: c.LongPoll,
		ShutdownGrace: c.ShutdownGrace, Logger: logger}
}

// redactedURL hides credentials (user info, and a password query parameter) in a URL
// for messages.
func redactedURL(u string) string {
	if i := strings.Index(u, "@"); i > 0 {
		if j := strings.Index(u, "://"); j > 0 && j < i {
			u = u[:j+3] + "***" + u[i:]
		}
	}
	if i := strings.Index(u, "password="); i > 0 {
		end := strings.IndexByte(u[i:], '&')
		if end < 0 {
			end = len(u) - i
		}
		u = u[:i] + "password=***" + u[i+end:]
	}
	return u
}
