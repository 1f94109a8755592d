package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/internal/failpoint"
)

// Publisher sends one event and returns once the broker has taken responsibility for it
// (a publisher confirm), or with why not. AMQPPublisher is the RabbitMQ one.
//
// The relay's ctx carries the span of the publish when the event was added in a trace,
// and no span otherwise: a publisher sends its W3C trace context along, as
// AMQPPublisher does in the traceparent and tracestate headers
// (otel.GetTextMapPropagator().Inject).
type Publisher interface {
	Publish(ctx context.Context, e Event) error
}

// RelayConfig configures a Relay. Zero values take the documented defaults.
type RelayConfig struct {
	// Namespace is the outbox's namespace (the ledger's). Default "default".
	Namespace string
	// Batch is how many events one pass takes at most. Default 100.
	Batch int
	// PollInterval is the pause after a pass that found nothing to publish. Default 1s.
	PollInterval time.Duration
	// BackoffInitial and BackoffMax bound the wait before an event whose publish failed
	// is tried again, doubling per attempt. Defaults 1s and 1m.
	BackoffInitial, BackoffMax time.Duration
	// PublishTimeout bounds each publish, its confirm included. Default 10s.
	PublishTimeout time.Duration
	// Logger receives publish failures at warn level. Default discard.
	Logger *slog.Logger
	// Observer counts publishes (metrics.OutboxCollector is one). Default none.
	Observer Observer
}

// Observer is told of each publish.
type Observer interface {
	Published()
	PublishFailed()
}

type nopObserver struct{}

func (nopObserver) Published()     {}
func (nopObserver) PublishFailed() {}

func (c RelayConfig) withDefaults() RelayConfig {
	if c.Namespace == "" {
		c.Namespace = "default"
	}
	if c.Batch <= 0 {
		c.Batch = 100
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.BackoffInitial <= 0 {
		c.BackoffInitial = time.Second
	}
	if c.BackoffMax < c.BackoffInitial {
		c.BackoffMax = max(time.Minute, c.BackoffInitial)
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	return c
}

// Relay publishes what the outbox holds. Any number of relays may run on one outbox: each
// event is taken by one of them at a time, and the events of one ordering key in order.
type Relay struct {
	pool *pgxpool.Pool
	pub  Publisher
	cfg  RelayConfig
}

// NewRelay returns a relay publishing pool's outbox through pub.
func NewRelay(pool *pgxpool.Pool, pub Publisher, cfg RelayConfig) *Relay {
	return &Relay{pool: pool, pub: pub, cfg: cfg.withDefaults()}
}

// Run publishes until ctx ends: a pass, then the next at once while passes publish
// events, else after PollInterval. A failing database is logged and retried; it never ends Run.
func (r *Relay) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := r.PublishPending(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			r.cfg.Logger.Warn("outbox relay pass failed; trying again", slog.Any("error", err))
			t.Reset(r.cfg.PollInterval)
		case n > 0:
			// Published something: the next event of each key may be due now (a pass
			// takes one per ordering key, so a backlog on few keys drains pass by pass).
			t.Reset(0)
		default:
			t.Reset(r.cfg.PollInterval)
		}
	}
}

// pending is one event as the relay takes it.
type pending struct {
	id       int64
	attempts int
	e        Event
	// traceparent and tracestate are the W3C trace context Add kept, "" without one.
	traceparent, tracestate string
}

// PublishPending makes one pass: it takes the next unpublished event of each ordering key
// that is due (at most Batch), publishes each, and marks the published ones, in one
// transaction that holds them meanwhile. It returns how many it published. An event
// whose publish failed waits with backoff; one that the broker confirmed but this pass
// could not mark is published again by a later pass, with the same message id.
func (r *Relay) PublishPending(ctx context.Context) (int, error) {
	published := 0
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT o.id, o.attempts, o.message_id, o.type, o.exchange, o.routing_key, o.ordering_key,
				coalesce(o.correlation_id, ''), o.body, coalesce(o.traceparent, ''), coalesce(o.tracestate, '')
			FROM extworker_outbox o
			WHERE o.namespace = $1 AND o.published_at IS NULL AND o.next_attempt_at <= now()
				AND NOT EXISTS (SELECT FROM extworker_outbox p WHERE p.namespace = o.namespace AND p.ordering_key = o.ordering_key
					AND p.published_at IS NULL AND p.id < o.id)
			ORDER BY o.id LIMIT $2 FOR UPDATE OF o SKIP LOCKED`, r.cfg.Namespace, r.cfg.Batch)
		if err != nil {
			return err
		}
		batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (pending, error) {
			var p pending
			err := row.Scan(&p.id, &p.attempts, &p.e.MessageID, &p.e.Type, &p.e.Exchange, &p.e.RoutingKey, &p.e.OrderingKey,
				&p.e.CorrelationID, &p.e.Body, &p.traceparent, &p.tracestate)
			return p, err
		})
		if err != nil {
			return err
		}
		for _, p := range batch {
			failpoint.Inject(failpoint.OutboxBeforePublish)
			pctx, span := r.startPublishSpan(ctx, p)
			pctx, cancel := context.WithTimeout(pctx, r.cfg.PublishTimeout)
			perr := r.pub.Publish(pctx, p.e)
			cancel()
			endPublishSpan(span, perr)
			if perr != nil {
				r.cfg.Observer.PublishFailed()
				wait := r.backoff(p.attempts + 1)
				r.cfg.Logger.Warn("publishing an outbox event failed; it waits and is tried again",
					slog.String("message_id", p.e.MessageID), slog.Int("attempt", p.attempts+1), slog.Duration("wait", wait), slog.Any("error", perr))
				if _, err := tx.Exec(ctx, `UPDATE extworker_outbox SET attempts = attempts + 1, last_error = $2,
						next_attempt_at = now() + $3::bigint * interval '1 microsecond' WHERE id = $1`, p.id, perr.Error(), wait.Microseconds()); err != nil {
					return err
				}
				continue
			}
			failpoint.Inject(failpoint.OutboxAfterPublish)
			if _, err := tx.Exec(ctx, `UPDATE extworker_outbox SET published_at = now(), body = NULL, last_error = NULL,
					attempts = attempts + 1 WHERE id = $1`, p.id); err != nil {
				return err
			}
			r.cfg.Observer.Published()
			published++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: relay: %w", err)
	}
	return published, nil
}

func (r *Relay) backoff(attempt int) time.Duration {
	d := r.cfg.BackoffInitial << min(max(attempt-1, 0), 20)
	if d <= 0 || d > r.cfg.BackoffMax {
		d = r.cfg.BackoffMax
	}
	return d
}

// Backlog is what waits to be published.
type Backlog struct {
	Unpublished int
	// OldestAge is how long the oldest unpublished event has waited (0 with none).
	OldestAge time.Duration
	// Failing counts the unpublished events whose last publish failed.
	Failing int
}

// Backlog reads the relay's outbox backlog (ReadBacklog).
func (r *Relay) Backlog(ctx context.Context) (Backlog, error) {
	return ReadBacklog(ctx, r.pool, r.cfg.Namespace)
}

// ReadBacklog reads namespace's outbox backlog, for metrics and alerts: a relay that is
// stuck shows as an age that keeps growing.
func ReadBacklog(ctx context.Context, pool *pgxpool.Pool, namespace string) (Backlog, error) {
	var b Backlog
	var age *float64
	err := pool.QueryRow(ctx, `SELECT count(*), extract(epoch FROM now() - min(created_at)), count(*) FILTER (WHERE last_error IS NOT NULL)
		FROM extworker_outbox WHERE namespace = $1 AND published_at IS NULL`, namespace).Scan(&b.Unpublished, &age, &b.Failing)
	if err != nil {
		return b, fmt.Errorf("outbox: backlog: %w", err)
	}
	if age != nil {
		b.OldestAge = time.Duration(*age * float64(time.Second))
	}
	return b, nil
}

// Unpublished is an event waiting to be published, as an operator sees it. Its body is
// not read: it is business data, and an operator needs to know what is stuck, not what
// it says.
type Unpublished struct {
	ID                       int64
	MessageID, Type          string
	Exchange, RoutingKey     string
	CreatedAt, NextAttemptAt time.Time
	Attempts                 int
	LastError                string
}

// ReadUnpublished reads at most limit of namespace's unpublished events, oldest first
// (the operator console's outbox page).
func ReadUnpublished(ctx context.Context, pool *pgxpool.Pool, namespace string, limit int) ([]Unpublished, error) {
	rows, err := pool.Query(ctx, `SELECT id, message_id, type, exchange, routing_key, created_at, next_attempt_at, attempts,
			coalesce(last_error, '')
		FROM extworker_outbox WHERE namespace = $1 AND published_at IS NULL ORDER BY id LIMIT $2`, namespace, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: unpublished: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Unpublished, error) {
		var u Unpublished
		err := r.Scan(&u.ID, &u.MessageID, &u.Type, &u.Exchange, &u.RoutingKey, &u.CreatedAt, &u.NextAttemptAt, &u.Attempts, &u.LastError)
		return u, err
	})
}

// Prune deletes the events published more than olderThan ago (their bodies are gone
// already; the rows are the record of what was published), in batches, and returns how
// many it deleted. Unpublished events are never pruned.
func (r *Relay) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	var total int64
	for {
		tag, err := r.pool.Exec(ctx, `DELETE FROM extworker_outbox WHERE id IN (SELECT id FROM extworker_outbox
			WHERE namespace = $1 AND published_at < now() - $2::bigint * interval '1 microsecond' ORDER BY id LIMIT 1000)`,
			r.cfg.Namespace, olderThan.Microseconds())
		if err != nil {
			return total, fmt.Errorf("outbox: prune: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}

// ErrUnroutable: the broker confirmed a message it could not route to any queue (a
// mandatory publish returned): nothing would have received it, so it counts as not
// published.
var ErrUnroutable = errors.New("outbox: the broker routed the message to no queue")
