package extworker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"time"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/humantask/taskpage"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/metrics"
)

// HumanTasks gives the human-task completion service (package humantask,
// docs/humantasks.md) its business rules, by task definition key: a Guard refuses a
// completion (422) with its reason. The service itself is served by Run whenever
// EXTWORKER_TASKS_ADDR is set, on a listener of its own (over TLS with
// EXTWORKER_TASKS_TLS_CERT_FILE and _KEY_FILE), with or without this call: GET /tasks,
// GET /tasks/{id} and POST /tasks/{id}/complete, and with EXTWORKER_TASKS_PAGE=true the
// sample task page under /ui/ (package humantask/taskpage). Users are told apart by
// EXTWORKER_TASKS_AUTH_HEADER (a trusted proxy's header) or EXTWORKER_TASKS_JWT_*
// (bearer tokens); tasks are completed with the App's engine credentials, and each
// command is recorded in the ledger (namespace EXTWORKER_TASKS_NAMESPACE). It may be
// called more than once; a key given twice is a configuration error, as is a call
// without EXTWORKER_TASKS_ADDR. A process may serve human tasks only, without topics.
func (a *App) HumanTasks(guards map[string]humantask.Guard) error {
	if a.cfg.TasksAddr == "" {
		return a.configError(errors.New("human tasks need EXTWORKER_TASKS_ADDR, their listener"))
	}
	if a.taskGuards == nil {
		a.taskGuards = map[string]humantask.Guard{}
	}
	for key, g := range guards {
		if _, twice := a.taskGuards[key]; twice {
			return a.configError(fmt.Errorf("human tasks: a second guard for task definition %q", key))
		}
		if g == nil {
			return a.configError(fmt.Errorf("human tasks: the guard of task definition %q is nil", key))
		}
	}
	maps.Copy(a.taskGuards, guards)
	return nil
}

// servesHumanTasks reports whether Run serves the human-task service.
func (a *App) servesHumanTasks() bool { return a.cfg.TasksAddr != "" }

// serveHumanTasks listens on EXTWORKER_TASKS_ADDR and serves the service (and the page)
// until stop is called. An address it cannot take, or TLS files it cannot load, is a
// configuration error.
func (a *App) serveHumanTasks(ctx context.Context) (stop func(), err error) {
	id, err := a.cfg.TasksIdentity()
	if err != nil {
		return nil, daemon.ConfigError{Err: fmt.Errorf("human tasks: %w", err)}
	}
	counts, err := metrics.NewHumanTaskMetrics(a.promReg)
	if err != nil {
		return nil, err
	}
	svc, err := humantask.New(humantask.Config{Engine: admin.New(a.client), Pool: a.pool, Identity: id, Guards: a.taskGuards,
		Namespace: a.cfg.TasksNamespace, Logger: a.logger, Observer: counts, LedgerObserver: a.metrics})
	if err != nil {
		return nil, daemon.ConfigError{Err: err}
	}
	mux := http.NewServeMux()
	mux.Handle("/tasks", svc.Handler())
	mux.Handle("/tasks/", svc.Handler())
	if a.cfg.TasksPage {
		page, err := taskpage.New(taskpage.Config{Service: svc, Logger: a.logger})
		if err != nil {
			return nil, daemon.ConfigError{Err: err}
		}
		mux.Handle("/ui/", page)
		mux.Handle("/ui", page)
	}
	var tlsCfg *tls.Config
	if a.cfg.TasksTLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(a.cfg.TasksTLSCertFile, a.cfg.TasksTLSKeyFile)
		if err != nil {
			return nil, daemon.ConfigError{Err: fmt.Errorf("EXTWORKER_TASKS_TLS_CERT_FILE, EXTWORKER_TASKS_TLS_KEY_FILE: %w", err)}
		}
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	}
	ln, err := net.Listen("tcp", a.cfg.TasksAddr)
	if err != nil {
		return nil, daemon.ConfigError{Err: fmt.Errorf("EXTWORKER_TASKS_ADDR %s: %w", a.cfg.TasksAddr, err)}
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: 2 * time.Minute,
		IdleTimeout: 2 * time.Minute}
	a.logger.Info("human tasks listening", slog.String("addr", ln.Addr().String()), slog.Bool("tls", tlsCfg != nil),
		slog.Bool("page", a.cfg.TasksPage), slog.Int("guards", len(a.taskGuards)))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.logger.Error("the human tasks' listener failed", slog.Any("error", err))
		}
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		<-done
	}, nil
}
