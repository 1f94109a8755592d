package extworker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/inbox/callback"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/metrics"
	"github.com/extworker/extworker/outbox"
)

// ConsumeKafka consumes the topic cfg.Queue into the inbox while Run runs, in consumer
// group group, with the same guarantees as Consume: each message recorded before it is
// acted on, acted on once; early ones wait in the topic's retry topic, unreadable and
// conflicting ones are parked in its dead-letter topic. The inbox records its messages
// under inbox.KafkaSource(cfg.Source, cfg.Queue). It needs EXTWORKER_KAFKA_BROKERS; with
// EXTWORKER_KAFKA_REPLAY=true every message is a historical replay, which never starts a
// process. A configuration error is returned here and again by Run.
func (a *App) ConsumeKafka(cfg inbox.Config, group string, decide inbox.Decide) error {
	if len(a.cfg.KafkaBrokers) == 0 {
		return a.configError(fmt.Errorf("consuming the topic %s needs EXTWORKER_KAFKA_BROKERS", cfg.Queue))
	}
	cfg, pool, err := a.inboxPool(cfg)
	if err != nil {
		return a.configError(err)
	}
	c, err := inbox.NewKafkaConsumer(pool, admin.New(a.client), decide, cfg, inbox.KafkaConfig{Brokers: a.cfg.KafkaBrokers,
		Group: group, Replay: a.cfg.KafkaReplay, SessionTimeout: a.cfg.KafkaSessionTimeout, Options: a.cfg.KafkaOptions()})
	if err != nil {
		pool.Close()
		return a.configError(err)
	}
	a.countInbox(cfg.Queue, c.Stats())
	a.runners = append(a.runners, c.Run)
	return nil
}

// Callback takes the provider callbacks of source cfg.Source into the inbox while Run
// runs (package inbox/callback, docs/callbacks.md): POST /callbacks/{source} on
// EXTWORKER_CALLBACK_ADDR, signed (the Standard Webhooks scheme) with one of the secrets
// in daemon.CallbackSecretsVar(source) (EXTWORKER_CALLBACK_SECRETS_<SOURCE>). Each is
// acted on once, as decide says; the answer is the inbox row's, the same for every copy.
// A configuration error is returned here and again by Run.
func (a *App) Callback(cfg inbox.Config, decide inbox.Decide) error {
	if a.cfg.CallbackAddr == "" {
		return a.configError(fmt.Errorf("the callbacks of %s need EXTWORKER_CALLBACK_ADDR, their listener", cfg.Source))
	}
	secrets, err := a.callbackSecrets(cfg.Source)
	if err != nil {
		return a.configError(err)
	}
	if cfg.Queue == "" {
		cfg.Queue = inbox.CallbackChannel
	}
	cfg, pool, err := a.inboxPool(cfg)
	if err != nil {
		return a.configError(err)
	}
	h, err := inbox.NewHandler(pool, admin.New(a.client), decide, cfg)
	if err != nil {
		pool.Close()
		return a.configError(err)
	}
	a.countInbox("callbacks "+cfg.Source, h.Stats())
	a.callbacks = append(a.callbacks, callback.Source{Handler: h, Secrets: secrets})
	if a.callbackPool == nil {
		a.callbackPool = pool
	}
	return nil
}

// callbackSecrets reads and checks the secrets of a callback source, which must have a
// name of its own (no channel's source, and a secrets variable no other source reads).
func (a *App) callbackSecrets(source string) ([]string, error) {
	if inbox.ReservedSource(source) {
		return nil, fmt.Errorf("callback source %q: a name with %q is a Kafka topic's source (inbox.KafkaSource)", source, inbox.KafkaSource("", ""))
	}
	name := daemon.CallbackSecretsVar(source)
	for _, other := range a.callbacks {
		if o := other.Handler.Config().Source; daemon.CallbackSecretsVar(o) == name {
			return nil, fmt.Errorf("callback sources %q and %q would share the secrets of %s: name them apart", o, source, name)
		}
	}
	secrets, err := daemon.CallbackSecrets(source)
	if err != nil {
		return nil, err
	}
	for _, s := range secrets {
		if _, err := callback.ParseSecret(s); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return secrets, nil
}

// configError records err as a configuration error, for Run to return too.
func (a *App) configError(err error) error {
	err = daemon.ConfigError{Err: err}
	a.errs = append(a.errs, err)
	return err
}

// inboxPool applies the inbox's defaults to cfg (its logger the App's) and opens the pool
// of its own it is sized for: each message in hand holds a connection across the
// engine's calls, which the handlers' ledger must not wait behind.
func (a *App) inboxPool(cfg inbox.Config) (inbox.Config, *pgxpool.Pool, error) {
	if cfg.Logger == nil {
		cfg.Logger = a.logger
	}
	cfg, err := cfg.WithDefaults(admin.New(a.client))
	if err != nil {
		return cfg, nil, err
	}
	pool, err := daemon.OpenInboxPool(context.Background(), a.cfg, cfg.Concurrency)
	if err != nil {
		return cfg, nil, err
	}
	a.inboxPools = append(a.inboxPools, pool)
	return cfg, pool, nil
}

// countInbox exposes a consumer's counts as metrics, by channel.
func (a *App) countInbox(channel string, s *inbox.Stats) {
	if a.inboxStats == nil {
		a.inboxStats = metrics.NewInboxCollector(func(ctx context.Context) (inbox.Parked, error) {
			return inbox.ReadParked(ctx, a.pool, "")
		}, a.ops.ReadyTimeout, a.logger)
		a.promReg.MustRegister(a.inboxStats)
	}
	a.inboxStats.Add(channel, s)
}

// consumes reports whether the App takes messages from any channel.
func (a *App) consumes() bool {
	return len(a.consumers) > 0 || len(a.runners) > 0 || len(a.callbacks) > 0
}

// runChannels starts the consumers, the callbacks' listener and the outbox relay on
// background, for as long as ctx lasts.
func (a *App) runChannels(ctx context.Context, background *sync.WaitGroup) error {
	// The callbacks' listener first: an address it cannot take fails Run before anything
	// else has started.
	if len(a.callbacks) > 0 {
		if err := a.serveCallbacks(ctx, background); err != nil {
			return err
		}
	}
	for _, c := range a.consumers {
		background.Go(func() { _ = c.Run(ctx) })
	}
	for _, run := range a.runners {
		background.Go(func() { _ = run(ctx) })
	}
	if a.relay != nil {
		background.Go(func() {
			// RabbitMQ routes an event only to the queues bound when it is published: the
			// relay starts once this process's consumers have declared theirs.
			for _, c := range a.consumers {
				select {
				case <-c.Declared():
				case <-ctx.Done():
					return
				}
			}
			_ = a.relay.Run(ctx)
		})
	}
	return nil
}

// serveCallbacks listens on EXTWORKER_CALLBACK_ADDR and handles again the callbacks held
// while nothing waits for them.
func (a *App) serveCallbacks(ctx context.Context, background *sync.WaitGroup) error {
	srv, err := callback.New(a.callbackPool, a.callbacks, callback.Config{Tolerance: a.cfg.CallbackTolerance,
		MaxBody: a.cfg.CallbackMaxBody, Logger: a.logger})
	if err != nil {
		return daemon.ConfigError{Err: err}
	}
	ln, err := net.Listen("tcp", a.cfg.CallbackAddr)
	if err != nil {
		return daemon.ConfigError{Err: fmt.Errorf("EXTWORKER_CALLBACK_ADDR %s: %w", a.cfg.CallbackAddr, err)}
	}
	mux := http.NewServeMux()
	mux.Handle("/callbacks/{source}", srv) // the server answers another method itself (405, JSON)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	a.logger.Info("provider callbacks listening", slog.String("addr", ln.Addr().String()))
	background.Go(func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.logger.Error("the callbacks' listener failed", slog.Any("error", err))
		}
	})
	background.Go(func() { _ = srv.Run(ctx) })
	background.Go(func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	})
	return nil
}

// openRelay makes the outbox relay, which publishes what handlers added in their
// transactions (outbox.Add) to the broker daemon.Config.Outbox names, and exposes its
// backlog and publishes as metrics; none without a broker.
func (a *App) openRelay() error {
	var pub outbox.Publisher
	switch a.cfg.Outbox() {
	case daemon.OutboxAMQP:
		p := outbox.NewAMQPPublisher(a.cfg.AMQPURL)
		pub, a.pub = p, p
	case daemon.OutboxKafka:
		p, err := outbox.NewKafkaPublisher(a.cfg.KafkaBrokers, a.cfg.KafkaOptions()...)
		if err != nil {
			return daemon.ConfigError{Err: err}
		}
		pub, a.pub = p, p
	default:
		return nil
	}
	ns := a.ledger.Namespace()
	collector := metrics.NewOutboxCollector(func(ctx context.Context) (outbox.Backlog, error) {
		return outbox.ReadBacklog(ctx, a.pool, ns)
	}, a.ops.ReadyTimeout, a.logger)
	a.promReg.MustRegister(collector)
	a.relay = outbox.NewRelay(a.pool, pub, outbox.RelayConfig{Namespace: ns, Logger: a.logger, Observer: collector})
	return nil
}
