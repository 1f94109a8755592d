package console

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/operate"
)

// Server is the console as the entry point runs it: its handler, its own database pool
// and its own listener, never the operations endpoint's.
type Server struct {
	cfg     daemon.Config
	handler http.Handler
	pool    *pgxpool.Pool
	logger  *slog.Logger
}

// consoleMaxConns caps the console's pool: a few operators read pages.
const consoleMaxConns = 4

// Open builds the console from the configuration (EXTWORKER_CONSOLE_*): it reads the
// operators file and the session key, connects to the ledger as the console's login and
// says on every page when that login cannot do an operator's work. Its errors are
// configuration errors, except an unreachable database.
func Open(ctx context.Context, cfg daemon.Config, client *camunda7.Client, logger *slog.Logger) (*Server, error) {
	o := Options{AuthHeader: cfg.ConsoleAuthHeader, SessionTTL: cfg.ConsoleSessionTTL, CockpitURL: cfg.CockpitURL(), Logger: logger,
		Addr: cfg.ConsoleAddr, AllowedHosts: cfg.ConsoleAllowedHosts, SecureCookies: cfg.ConsoleSecureCookies,
		Engine: operate.Engine{URL: daemon.RedactURL(cfg.EngineURL), Dial: func() (*camunda7.Client, error) {
			if client == nil {
				return nil, errors.New("no engine client")
			}
			return client, nil
		}}}
	var err error
	if cfg.ConsoleOperatorsFile != "" {
		if o.Operators, err = ReadOperators(cfg.ConsoleOperatorsFile); err != nil {
			return nil, daemon.ConfigError{Err: err}
		}
	}
	if o.TrustedProxies, err = daemon.ConsoleTrustedProxies(cfg.ConsoleTrustedProxies); err != nil {
		return nil, daemon.ConfigError{Err: err}
	}
	if _, err = CheckTrustedProxies(o.TrustedProxies); err != nil {
		return nil, daemon.ConfigError{Err: err}
	}
	if cfg.ConsoleSessionKeyFile != "" {
		key, err := os.ReadFile(cfg.ConsoleSessionKeyFile)
		if err != nil {
			return nil, daemon.ConfigError{Err: fmt.Errorf("EXTWORKER_CONSOLE_SESSION_KEY_FILE: %w", err)}
		}
		if len(key) < 32 {
			return nil, daemon.ConfigError{Err: errors.New("EXTWORKER_CONSOLE_SESSION_KEY_FILE: the key has fewer than 32 bytes (head -c 32 /dev/urandom > key)")}
		}
		o.SessionKey = key
	}
	lcfg := cfg
	lcfg.DatabaseURL, lcfg.LedgerMaxConns = cfg.ConsoleDatabase(), consoleMaxConns
	ledger, pool, err := daemon.OpenLedger(ctx, lcfg, logger, true)
	if err != nil {
		return nil, fmt.Errorf("console database (EXTWORKER_CONSOLE_DATABASE_URL, or the worker's): %w", err)
	}
	o.Ledger, o.DB = ledger.Operations(), pool
	o.Notice = loginNotice(ctx, pool, logger)
	h, err := New(o)
	if err != nil {
		pool.Close()
		return nil, daemon.ConfigError{Err: err}
	}
	return &Server{cfg: cfg, handler: h, pool: pool, logger: logger}, nil
}

// loginNotice says what the console's database login cannot do, for every page and the
// log: take intents out of operator hold (a worker's login that is not an operator: the
// hold trigger of migrations/00003 refuses it), or approve one operator's verdict for
// another (not the console's role, so the ledger compares database users, which are all
// the console's). The empty string when it can do both.
func loginNotice(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) string {
	var user, role string
	var worker, operator, console bool
	// The ledger's role names are its own (extworker_ledger_roles, migrations/00009).
	err := pool.QueryRow(ctx, `SELECT session_user, extworker_role('console'), extworker_member('worker'), extworker_member('operator'),
		extworker_member('console')`).Scan(&user, &role, &worker, &operator, &console)
	if err != nil {
		logger.Warn("console: could not check the database login's roles", slog.Any("error", err))
		return ""
	}
	var notice string
	switch {
	case worker && !operator:
		notice = fmt.Sprintf("The console's database login %s is a worker's, not an operator's: the ledger refuses to take a held intent out of hold for it. "+
			"Set EXTWORKER_CONSOLE_DATABASE_URL to a login in role %s (docs/console.md).", user, role)
	case !console:
		notice = fmt.Sprintf("The console's database login %s is not a member of %s: the ledger does not take the operator names this console attests, "+
			"so every operator here acts as that one login and approvals will be refused. Set EXTWORKER_CONSOLE_DATABASE_URL to a login in role %s, "+
			"and register each operator (extworker operators add NAME; docs/operators.md).", user, role, role)
	}
	if notice != "" {
		logger.Warn("console: " + notice)
	}
	return notice
}

// Handler is the console's http.Handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Start serves the console on EXTWORKER_CONSOLE_ADDR until stop is called, over TLS when
// EXTWORKER_CONSOLE_TLS_CERT_FILE and _KEY_FILE are set. Plain HTTP on an address other
// than loopback is served with a warning: passwords and session cookies would cross the
// network in clear unless a proxy in front terminates TLS. It returns the address it
// listens on.
func (s *Server) Start(ctx context.Context) (addr string, stop func(), err error) {
	var tlsCfg *tls.Config
	if s.cfg.ConsoleTLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(s.cfg.ConsoleTLSCertFile, s.cfg.ConsoleTLSKeyFile)
		if err != nil {
			return "", nil, daemon.ConfigError{Err: fmt.Errorf("EXTWORKER_CONSOLE_TLS_CERT_FILE/KEY_FILE: %w", err)}
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.cfg.ConsoleAddr)
	if err != nil {
		return "", nil, fmt.Errorf("console: listen on EXTWORKER_CONSOLE_ADDR %s: %w", s.cfg.ConsoleAddr, err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	} else if host, _, _ := net.SplitHostPort(s.cfg.ConsoleAddr); !loopback(host) {
		s.logger.Warn("console served over plain HTTP on an address other than loopback: passwords and session cookies cross the network in clear "+
			"unless a proxy in front terminates TLS; set EXTWORKER_CONSOLE_TLS_CERT_FILE and EXTWORKER_CONSOLE_TLS_KEY_FILE",
			slog.String("addr", ln.Addr().String()))
	}
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: time.Minute,
		IdleTimeout: 2 * time.Minute, ErrorLog: slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("console server failed", slog.Any("error", err))
		}
	}()
	s.logger.Info("operator console serving", slog.String("addr", ln.Addr().String()), slog.Bool("tls", tlsCfg != nil))
	stopped := false
	return ln.Addr().String(), func() {
		if stopped {
			return
		}
		stopped = true
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, nil
}

// Close releases the console's database pool.
func (s *Server) Close() {
	if s.pool != nil {
		s.pool.Close()
	}
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
