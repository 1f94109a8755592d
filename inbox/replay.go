package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/extworker/extworker/internal/digest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Record is an inbox row, for operators and tests.
type Record struct {
	Source, MessageID, Type   string
	BodyDigest, CorrelationID string
	State                     State
	Action, BusinessKey       string
	ProcessInstanceID         string
	Reason                    string
	Deliveries, Duplicates    int
	Attempts, Conflicts       int
	Replays                   int
	ReceivedAt, UpdatedAt     time.Time
	ProcessedAt, ParkedAt     *time.Time
	// Queue is the queue of the last delivery that acted on the message: the one whose
	// retry or dead-letter queue holds its copy. A duplicate, or a conflicting copy,
	// delivered from another queue leaves it. ("" for rows recorded before the inbox
	// recorded it.)
	Queue string
	// ParkKind says why a parked message was parked; "" otherwise.
	ParkKind ParkKind
	// MustReconcile: an attempt's outcome at the engine is unknown; the next attempt asks
	// the engine before it sends anything.
	MustReconcile bool
	// EngineFailures counts the engine's failures (5xx) on the message since its first
	// delivery or last replay.
	EngineFailures int
}

// Filter selects inbox rows. Zero fields select everything.
type Filter struct {
	Source    string
	MessageID string
	// MessageIDPrefix selects the rows whose message id begins with it.
	MessageIDPrefix string
	// Parked selects the parked rows (failed_final) and those with conflicting copies.
	Parked bool
	States []State
	// Limit caps the rows returned. Default 100.
	Limit int
}

// List returns the inbox rows f selects, newest first.
func List(ctx context.Context, db Querier, f Filter) ([]Record, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	states := make([]string, 0, len(f.States))
	for _, s := range f.States {
		states = append(states, string(s))
	}
	rows, err := db.Query(ctx, `SELECT source, message_id, type, body_digest, coalesce(correlation_id, ''), state, coalesce(action, ''),
			coalesce(business_key, ''), coalesce(process_instance_id, ''), coalesce(reason, ''), deliveries, duplicates, attempts,
			conflicts, replays, received_at, updated_at, processed_at, parked_at, coalesce(queue, ''), coalesce(park_kind, ''),
			must_reconcile, engine_failures
		FROM extworker_inbox
		WHERE ($1 = '' OR source = $1) AND ($2 = '' OR message_id = $2) AND (NOT $3 OR state = 'failed_final' OR conflicts > 0)
			AND (cardinality($4::text[]) = 0 OR state = ANY($4)) AND ($6 = '' OR left(message_id, char_length($6)) = $6)
		ORDER BY updated_at DESC LIMIT $5`, f.Source, f.MessageID, f.Parked, states, f.Limit, f.MessageIDPrefix)
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var r Record
		err := row.Scan(&r.Source, &r.MessageID, &r.Type, &r.BodyDigest, &r.CorrelationID, &r.State, &r.Action, &r.BusinessKey,
			&r.ProcessInstanceID, &r.Reason, &r.Deliveries, &r.Duplicates, &r.Attempts, &r.Conflicts, &r.Replays,
			&r.ReceivedAt, &r.UpdatedAt, &r.ProcessedAt, &r.ParkedAt, &r.Queue, &r.ParkKind, &r.MustReconcile, &r.EngineFailures)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	return out, nil
}

// Querier is what List needs: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ReplayReport says what Replay did with the dead-letter queue's messages. Messages are
// named by their stored id (StoredID).
type ReplayReport struct {
	// Replayed lists the message ids sent back to the queue.
	Replayed []string
	// Conflicts lists the selected messages left in the dead-letter queue because their
	// body is not the one the inbox consumed under their id (or the inbox has no parked
	// row of theirs): replaying would only park them again. The producer has to send them
	// with a new message id.
	Conflicts []string
	// Unreplayable lists the selected messages left in the dead-letter queue because a
	// replay cannot help them: they came without a message id ("" here), or with an id,
	// type or correlation id that is not text the inbox can store. The producer has to
	// send them anew.
	Unreplayable []string
	// Kept counts the messages not selected, left in the dead-letter queue.
	Kept int
}

// Replay sends parked messages from queue's dead-letter queue back to queue: those whose
// stored message id selected returns true for. Each one's inbox row goes back to received
// (its attempts and engine failures to zero, its early window restarting, its replays
// counted, the operator named in its reason; an unknown outcome at the engine stays to
// be reconciled), then the message is published to the queue with a confirm, then
// removed from the dead-letter queue: a replay that fails half-way may be run again.
func Replay(ctx context.Context, pool *pgxpool.Pool, amqpURL, queue string, selected func(id string) bool) (ReplayReport, error) {
	var rep ReplayReport
	conn, err := dial(ctx, amqpURL)
	if err != nil {
		return rep, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return rep, err
	}
	pub, err := newConfirmer(conn)
	if err != nil {
		return rep, err
	}
	dlq := DeadLetterQueue(queue)
	q, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil)
	if err != nil {
		return rep, fmt.Errorf("inbox: replay: no dead-letter queue %s: %w", dlq, err)
	}
	// Take each message present now once: those kept stay unacknowledged until the end,
	// so that a get never sees one twice.
	var keep []amqp.Delivery
	defer func() {
		for _, d := range keep {
			_ = d.Nack(false, true)
		}
	}()
	for range q.Messages {
		d, ok, err := ch.Get(dlq, false)
		if err != nil {
			return rep, fmt.Errorf("inbox: replay: %w", err)
		}
		if !ok {
			break
		}
		if !selected(dlqID(d)) {
			keep = append(keep, d)
			rep.Kept++
			continue
		}
		kept, err := replayOne(ctx, pool, pub, queue, d, &rep)
		if kept {
			keep = append(keep, d)
		}
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// dlqID names a parked message: its stored id, or "" for one without an id.
func dlqID(d amqp.Delivery) string {
	if d.MessageId == "" {
		return ""
	}
	return StoredID(d.MessageId)
}

// replayable reports whether a replay can help a parked message: one with an id, type
// and correlation id the inbox can store.
func replayable(d amqp.Delivery) bool {
	return d.MessageId != "" && storable(d.MessageId) && storable(d.Type) && storable(d.CorrelationId)
}

// replayOne puts one selected message back on queue, recording what it did in rep. kept
// says whether it stays in the dead-letter queue.
func replayOne(ctx context.Context, pool *pgxpool.Pool, pub *confirmer, queue string, d amqp.Delivery, rep *ReplayReport) (kept bool, err error) {
	id := dlqID(d)
	source, _ := d.Headers[HeaderSource].(string)
	switch {
	case !replayable(d):
		rep.Unreplayable = append(rep.Unreplayable, id)
		return true, nil
	case !storable(source):
		rep.Conflicts = append(rep.Conflicts, id)
		return true, nil
	}
	reopened, err := reopen(ctx, pool, source, id, digest.Bytes(d.Body))
	if err != nil {
		return true, err
	}
	if !reopened {
		rep.Conflicts = append(rep.Conflicts, id)
		return true, nil
	}
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if k != HeaderReason && k != HeaderDigest && k != HeaderAttempt {
			headers[k] = v
		}
	}
	d.Headers = headers
	if err := pub.publish(ctx, queue, d, nil, 0); err != nil {
		return true, fmt.Errorf("inbox: replay %s: %w", id, err)
	}
	if err := d.Ack(false); err != nil {
		return false, fmt.Errorf("inbox: replay %s: published again, but not removed from %s: %w", id, DeadLetterQueue(queue), err)
	}
	rep.Replayed = append(rep.Replayed, id)
	return false, nil
}

// reopen puts the parked row of message id from source, recorded with body digest sum,
// back to received (its attempts and engine failures to zero, its early window
// restarting, its replays counted, the operator named in its reason; an unknown outcome
// at the engine stays to be reconciled), through extworker_inbox_reopen (migration
// 00014: operators may not UPDATE the inbox). A row already received with that body
// (reopened by a replay that stopped before it sent the copy) is left as it is and
// reported true, so the replay can be run again. It reports false when there is no such
// row parked or received.
func reopen(ctx context.Context, pool *pgxpool.Pool, source, id, sum string) (bool, error) {
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT extworker_inbox_reopen($1, $2, $3)`, source, id, sum).Scan(&ok); err != nil {
		return false, fmt.Errorf("inbox: replay %s: %w", id, err)
	}
	if ok {
		return true, nil
	}
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM extworker_inbox
		WHERE source = $1 AND message_id = $2 AND body_digest = $3 AND state = 'received')`, source, id, sum).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("inbox: replay %s: %w", id, err)
	}
	return ok, nil
}

// Reopen puts the parked row of message id from source back to received, as Replay
// does, without a copy to send: for a channel that keeps none (provider callbacks,
// package inbox/callback, whose bodies are not kept once settled), the producer's next
// delivery of the message is acted on anew. It reports false when the message is not
// parked.
func Reopen(ctx context.Context, pool *pgxpool.Pool, source, id string) (bool, error) {
	var sum string
	err := pool.QueryRow(ctx, `SELECT body_digest FROM extworker_inbox WHERE source = $1 AND message_id = $2 AND state = 'failed_final'`,
		source, id).Scan(&sum)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("inbox: reopen %s: %w", id, err)
	}
	return reopen(ctx, pool, source, id, sum)
}
