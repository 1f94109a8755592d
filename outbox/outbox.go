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
//   - events with the same ordering key are published in the order they were added, one
//     at a time, across any number of relays;
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
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

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
	// (those of one invoice, say). Default: the message id (no order with other events).
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
// When ctx carries a span (the ledger's confirm, under a task's trace) and traces are on,
// its W3C trace context is kept with the event: the relay's publish continues that
// trace, and the message carries it in its traceparent and tracestate headers.
func Add(ctx context.Context, tx Querier, namespace string, e Event) error {
	if err := e.validate(); err != nil {
		return err
	}
	if e.OrderingKey == "" {
		e.OrderingKey = e.MessageID
	}
	digest := Digest(e.Body)
	traceparent, tracestate := traceContext(ctx)
	tag, err := tx.Exec(ctx, `INSERT INTO extworker_outbox (namespace, message_id, ordering_key, exchange, routing_key, type, correlation_id, body, body_digest,
			traceparent, tracestate)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (namespace, message_id) DO NOTHING`,
		namespace, e.MessageID, e.OrderingKey, e.Exchange, e.RoutingKey, e.Type, nz(e.CorrelationID), e.Body, digest, traceparent, tracestate)
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
	if stored != digest {
		return fmt.Errorf("%w: %s (digest %.12s…, this one %.12s…)", ErrConflict, e.MessageID, stored, digest)
	}
	return nil
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

// Digest is the SHA-256 of a body, hex-encoded: what the outbox keeps once the body is
// published.
func Digest(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

func nz(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
