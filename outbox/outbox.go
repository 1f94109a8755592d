// Package outbox publishes events exactly when the business change they announce
// commits: a handler adds them in the transaction of its business rows (and of the
// ledger's confirm, through idempotency.Effect.Local), and a Relay publishes them to the
// broker afterwards, marking each published once the broker has confirmed it.
//
// The guarantees, and what they leave to consumers:
//
//   - an event is added if and only if its transaction commits (no event for a change
//     rolled back, no change without its event);
//   - every added event is published at least once: the relay resumes after any crash,
//     and retries a failed publish with backoff for as long as it takes;
//   - an event may be published more than once (the relay died after the broker's
//     confirm and before it marked the event), always with the same message id: a
//     consumer deduplicates by it (package inbox, or the broker's own deduplication);
//   - events with the same ordering key are published in the order they were added (the
//     order in which their Add calls ran, whichever transaction commits first: see Add),
//     one at a time, across any number of relays;
//   - the body is kept only until the broker confirms it; then only its digest stays.
//
// Traces: an event added in a traced context keeps its W3C trace context; the relay's
// "outbox publish" span continues that trace, and the message carries it in the
// traceparent and tracestate headers, for the consumer's trace to continue it in turn.
//
// The events table is extworker_outbox, in the ledger's database (package migrations).
package outbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/extworker/extworker/internal/digest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Event is a message to publish.
type Event struct {
	// MessageID identifies the event, stably: derived from the business fact it announces
	// (e.g. "invoice.paid:INV-1"), never random, so that a handler that runs twice adds
	// it once and consumers recognise a republished event. Required.
	MessageID string
	// Type is the event's type, e.g. "invoice.paid". Required.
	Type string
	// Exchange is where it is published ("" is the broker's default exchange, which
	// routes by queue name).
	Exchange string
	// RoutingKey routes it. Required.
	RoutingKey string
	// OrderingKey groups the events that must be published in the order they were added
	// (those of one invoice, say); Add holds the key until its transaction ends (see Add
	// for what that costs). Default: the message id (no order with other events, no lock).
	OrderingKey string
	// CorrelationID is carried along, for replies and traces.
	CorrelationID string
	// Body is the payload, sent as application/json. Required.
	Body []byte
}

// ErrConflict: an event with the same message id but a different body was added before.
// Nothing was added.
var ErrConflict = errors.New("outbox: message id already added with a different body")

// Querier is what Add needs of a transaction: pgx.Tx, or any pgx connection or pool for
// an event added on its own.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Add adds e to namespace's outbox in tx, the transaction of the change it announces: it
// is published if and only if tx commits. Adding the same event again (same message id
// and body) does nothing; the same message id with another body is ErrConflict.
//
// An event with an OrderingKey holds its key until tx ends: the Add of another
// transaction for the same namespace and key waits until tx has committed or rolled
// back (a transaction-level advisory lock, taken in the same statement as the insert and
// before the event's id is drawn). So of two transactions adding to one key, the one
// whose Add ran first also commits first, its event has the lower id, and the relay,
// which publishes a key's events by id, publishes them in the order they were added;
// an event is never published while one added before it under its key is uncommitted.
// The cost: transactions adding to the same key run one after another from their Add to
// their commit (add events last, and keep that stretch short); two transactions adding
// to two keys in opposite orders deadlock, and PostgreSQL aborts one of them (40P01,
// to retry); each key held takes one entry of PostgreSQL's shared lock table
// (max_locks_per_transaction) until commit, so a transaction adding under thousands of
// keys at once needs that raised. Two keys whose 64-bit lock ids collide merely wait
// for each other. An event without an OrderingKey (its key is its message id, ordered
// with nothing) takes no lock. The order relies on extworker_outbox_id_seq handing out
// ids in the order they are drawn (its default CACHE 1: do not raise it).
//
// When ctx carries a span (the ledger's confirm, under a task's trace) and traces are on,
// its W3C trace context is kept with the event: the relay's publish continues that
// trace, and the message carries it in its traceparent and tracestate headers.
func Add(ctx context.Context, tx Querier, namespace string, e Event) error {
	if err := e.validate(); err != nil {
		return err
	}
	ordered := e.OrderingKey != ""
	if !ordered {
		e.OrderingKey = e.MessageID
	}
	bodyDigest := digest.Bytes(e.Body)
	traceparent, tracestate := traceContext(ctx)
	args := []any{namespace, e.MessageID, e.OrderingKey, e.Exchange, e.RoutingKey, e.Type, nz(e.CorrelationID), e.Body, bodyDigest, traceparent, tracestate}
	sql := insertEvent
	if ordered {
		sql, args = insertOrderedEvent, append(args, keyLockID(namespace, e.OrderingKey))
	}
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("outbox: add %s: %w", e.MessageID, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var stored string
	if err := tx.QueryRow(ctx, `SELECT body_digest FROM extworker_outbox WHERE namespace = $1 AND message_id = $2`, namespace, e.MessageID).Scan(&stored); err != nil {
		return fmt.Errorf("outbox: add %s: %w", e.MessageID, err)
	}
	if stored != bodyDigest {
		return fmt.Errorf("%w: %s (digest %.12s…, this one %.12s…)", ErrConflict, e.MessageID, stored, bodyDigest)
	}
	return nil
}

// insertEvent adds an event without an ordering key of its own.
const insertEvent = `INSERT INTO extworker_outbox (namespace, message_id, ordering_key, exchange, routing_key, type, correlation_id,
		body, body_digest, traceparent, tracestate)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (namespace, message_id) DO NOTHING`

// insertOrderedEvent adds an event under its ordering key: it first waits for, and
// takes until the transaction ends, the key's advisory lock ($12), then inserts, so that
// the event's id is drawn while the key is held (the insert reads its one row from the
// materialized lock).
const insertOrderedEvent = `WITH key_held AS MATERIALIZED (SELECT pg_advisory_xact_lock($12::bigint))
	INSERT INTO extworker_outbox (namespace, message_id, ordering_key, exchange, routing_key, type, correlation_id,
		body, body_digest, traceparent, tracestate)
	SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $8::bytea, $9::text, $10::text, $11::text
	FROM key_held ON CONFLICT (namespace, message_id) DO NOTHING`

// keyLockID is the PostgreSQL advisory lock (the single-bigint form) that Add holds for
// an ordering key of a namespace until its transaction ends: a 64-bit FNV-1a hash of
// both, under a prefix of the outbox's own, the same in every process.
func keyLockID(namespace, orderingKey string) int64 {
	h := fnv.New64a()
	h.Write([]byte("extworker_outbox\x00"))
	h.Write([]byte(namespace))
	h.Write([]byte{0})
	h.Write([]byte(orderingKey))
	return int64(h.Sum64())
}

func (e Event) validate() error {
	var missing []string
	if e.MessageID == "" {
		missing = append(missing, "MessageID")
	}
	if e.Type == "" {
		missing = append(missing, "Type")
	}
	if e.RoutingKey == "" {
		missing = append(missing, "RoutingKey")
	}
	if e.Body == nil {
		missing = append(missing, "Body")
	}
	if len(missing) > 0 {
		return fmt.Errorf("outbox: event %q needs %v", e.MessageID, missing)
	}
	return nil
}

func nz(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
