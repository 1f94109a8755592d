package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgStore keeps intents in PostgreSQL (the schema of package migrations). Leases, and
// the ages a reconciliation measures, are compared on the database's clock, shared by
// every worker.
type pgStore struct{ pool *pgxpool.Pool }

// claim takes the common cases in one statement, one round trip and one commit of its
// own: a new intent is recorded already claimed by this attempt (attempt 1, its lease,
// and marked dispatched when there is a Dispatch, committed before the request leaves),
// with the events that recording and claiming it append; an intent already settled with
// this request is read as it is, without a lock (a settled intent never moves, and the
// locked path would only read it too). Everything else takes the locked path.
func (s *pgStore) claim(ctx context.Context, a *attempt) error {
	req := a.claimRequest()
	start := time.Now() // the lease the database records starts no earlier
	found, inserted, ferr := s.recordOrRead(ctx, a, decideClaim(nil, req, start).to)
	switch {
	case ferr == nil && inserted:
		a.row, a.claimed = found, true
		a.leaseEnd = start.Add(req.lease)
		a.pending = []transition{{"", StatePrepared}}
		if found.State == StateDispatched {
			a.transitioned(ctx, StatePrepared, StateDispatched)
		}
		a.committed(nil)
		return nil
	case ferr == nil:
		// Settled and held intents do not depend on the clock (now is not read here).
		if d := decideClaim(&found, req, time.Time{}); d.kind == claimSettled || d.kind == claimHeld {
			a.row = found
			a.leaseEnd = start.Add(req.lease)
			return a.claimRefusal(ctx, d)
		}
	case !errors.Is(ferr, pgx.ErrNoRows):
		if err := a.compensationRace(ferr); err != nil {
			return err
		}
		a.pending = nil
		a.committed(ferr)
		return storeFailed(fmt.Errorf("idempotency: claim intent %s/%s: %w", a.in.Scope, a.in.Key, ferr))
	}
	// Not found: another attempt recorded it concurrently, after this statement's snapshot.
	return s.claimLocked(ctx, a, ferr == nil)
}

// recordOrRead records the intent claimed by this attempt in state to (with its events),
// or reads it as it is recorded (inserted false); pgx.ErrNoRows if neither (a tombstone
// refused it, or another attempt recorded it after this statement's snapshot).
func (s *pgStore) recordOrRead(ctx context.Context, a *attempt, to State) (row Row, inserted bool, err error) {
	in, cfg := a.in, a.l.cfg
	fctx, fcancel := a.writeCtx(ctx)
	defer fcancel()
	row, err = scanRowAnd(s.pool.QueryRow(fctx, `WITH ins AS (
			INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state, attempt,
				lease_owner, lease_until, dispatches, first_dispatched_at, last_dispatched_at, task_id, process_instance_id, business_key,
				amount, compensates_id)
			SELECT $1, $2, $3, $4, $5, $6, 1, $7, now() + $8::bigint * interval '1 microsecond',
				CASE WHEN $9 THEN 1 ELSE 0 END, CASE WHEN $9 THEN now() END, CASE WHEN $9 THEN now() END, $10, $11, $12, $14, $15
			WHERE NOT EXISTS (SELECT FROM extworker_intent_tombstones WHERE namespace = $1 AND scope = $2 AND intent_key = $3)
			ON CONFLICT (namespace, scope, intent_key) DO NOTHING RETURNING `+rowColumns+`),
		ev AS (
			INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
			SELECT id, NULL, 'prepared', 0, $13, $10, 'intent recorded' FROM ins
			UNION ALL
			SELECT id, 'prepared', 'dispatched', 1, $13, $10, 'dispatching with the provider key' FROM ins WHERE $9)
		SELECT `+rowColumns+`, true FROM ins
		UNION ALL
		SELECT `+rowColumns+`, false FROM extworker_intents
		WHERE namespace = $1 AND scope = $2 AND intent_key = $3 AND NOT EXISTS (SELECT FROM ins)`,
		cfg.Namespace, in.Scope, in.Key, a.digest, ProviderKey(cfg.Namespace, in.Scope, in.Key), to, nz(in.Task.Actor),
		cfg.Lease.Microseconds(), to == StateDispatched, nz(in.Task.TaskID), nz(in.Task.ProcessInstanceID), nz(in.Task.BusinessKey),
		actorOf(in.Task.Actor), amountOf(in.Amount), a.compensates),
		&inserted)
	return row, inserted, err
}

// claimLocked is the claim's locked path: the row read FOR UPDATE with the database's
// now(), decideClaim, and the claim it decides, in one transaction.
func (s *pgStore) claimLocked(ctx context.Context, a *attempt, exists bool) error {
	var result error
	start := time.Now()
	handlerCtx := ctx
	err := a.tx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		if !exists {
			if err := s.recordPrepared(ctx, tx, a); err != nil {
				return err
			}
		}
		var now time.Time
		row, err := scanRowAnd(tx.QueryRow(ctx, `SELECT `+rowColumns+`, now() FROM extworker_intents
			WHERE namespace = $1 AND scope = $2 AND intent_key = $3 FOR UPDATE`, a.l.cfg.Namespace, a.in.Scope, a.in.Key), &now)
		if errors.Is(err, pgx.ErrNoRows) {
			// Not recorded, and not recordable: the intent settled and was pruned.
			result, err = a.tombstoned(ctx, tx)
			return err
		}
		if err != nil {
			return err
		}
		a.row, a.dbNow, a.readAt = row, now, time.Now()
		a.leaseEnd = start.Add(a.l.cfg.Lease)
		d := decideClaim(&row, a.claimRequest(), now)
		switch d.kind {
		case claimMismatch:
			result = a.claimRefusal(ctx, d)
			return s.event(ctx, tx, a, row.State, row.State, a.mismatchReason())
		case claimTooManyTries:
			why := tooManyTriesReason(d.attempts)
			if err := s.moveTx(ctx, tx, a, row.State, StateOperatorHold, "operator hold: "+why, change{errorMessage: &why}); err != nil {
				result = storeFailed(err)
			} else {
				result = a.held(ctx, why, ErrTooManyTries)
			}
			return nil
		case claimTake:
			// The fence first: a cancelled attempt neither marks nor claims (the
			// statements run detached from ctx).
			if d.to == StateDispatched {
				if result = a.fence(handlerCtx); result != nil {
					return nil
				}
			}
			return s.take(ctx, tx, a, d, now)
		}
		result = a.claimRefusal(ctx, d)
		return nil
	})
	if err != nil {
		if cerr := a.compensationRace(err); cerr != nil {
			return cerr
		}
		return storeFailed(fmt.Errorf("idempotency: claim intent %s/%s: %w", a.in.Scope, a.in.Key, err))
	}
	return result
}

// recordPrepared records the intent, prepared and unclaimed, with its first event (when
// it is new: not if another attempt recorded it, or a tombstone refuses it).
func (s *pgStore) recordPrepared(ctx context.Context, tx pgx.Tx, a *attempt) error {
	in, ns := a.in, a.l.cfg.Namespace
	var id int64
	err := tx.QueryRow(ctx, `WITH ins AS (
			INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state,
				task_id, process_instance_id, business_key, amount, compensates_id)
			SELECT $1, $2, $3, $4, $5, 'prepared', $6, $7, $8, $10, $11
			WHERE NOT EXISTS (SELECT FROM extworker_intent_tombstones WHERE namespace = $1 AND scope = $2 AND intent_key = $3)
			ON CONFLICT (namespace, scope, intent_key) DO NOTHING RETURNING id),
		ev AS (
			INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
			SELECT id, NULL, 'prepared', 0, $9, $6, 'intent recorded' FROM ins)
		SELECT id FROM ins`,
		ns, in.Scope, in.Key, a.digest, ProviderKey(ns, in.Scope, in.Key), nz(in.Task.TaskID), nz(in.Task.ProcessInstanceID),
		nz(in.Task.BusinessKey), actorOf(in.Task.Actor), amountOf(in.Amount), a.compensates).Scan(&id)
	switch {
	case err == nil:
		a.pending = append(a.pending, transition{"", StatePrepared})
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	return nil
}

// take claims the locked row for this attempt as d decides (claimTake): one statement,
// the claim and its event when it is a transition.
func (s *pgStore) take(ctx context.Context, tx pgx.Tx, a *attempt, d claimDecision, now time.Time) error {
	row, in := a.row, a.in
	lease := now.Add(a.l.cfg.Lease)
	var moved int
	err := tx.QueryRow(ctx, `WITH moved AS (
			UPDATE extworker_intents SET attempt = attempt + 1, lease_owner = $2, lease_until = $3, state = $4,
				task_id = coalesce($5, task_id), process_instance_id = coalesce($6, process_instance_id), updated_at = now(),
				dispatches = dispatches + CASE WHEN $8 THEN 1 ELSE 0 END, abandoned_attempts = abandoned_attempts + $12,
				first_dispatched_at = CASE WHEN $8 THEN coalesce(first_dispatched_at, now()) ELSE first_dispatched_at END,
				last_dispatched_at = CASE WHEN $8 THEN now() ELSE last_dispatched_at END
			WHERE id = $1 AND attempt = $7 RETURNING id),
		ev AS (
			INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
			SELECT id, $9, $4, $7 + 1, $10, $5, $11 FROM moved WHERE $11 <> '')
		SELECT count(*) FROM moved`,
		row.ID, nz(in.Task.Actor), lease, d.to, nz(in.Task.TaskID), nz(in.Task.ProcessInstanceID), row.Attempt,
		d.to == StateDispatched, row.State, actorOf(in.Task.Actor), d.reason, d.abandoned).Scan(&moved)
	if err != nil {
		return err
	}
	if moved != 1 {
		return ErrFenced
	}
	a.row.Attempt++
	a.row.AbandonedAttempts += d.abandoned
	a.row.State = d.to
	a.row.LeaseUntil = &lease
	a.claimed = true
	if d.reason != "" {
		a.transitioned(ctx, row.State, d.to)
	}
	return nil
}

func (s *pgStore) move(ctx context.Context, a *attempt, from, to State, reason string, ch change) error {
	return a.tx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error { return s.moveTx(ctx, tx, a, from, to, reason, ch) })
}

// sql is what ch sets, as SQL assignments whose parameters are numbered from $5, and
// their arguments.
func (ch change) sql() (sets string, args []any) {
	if ch.dispatchMark {
		sets += ", dispatches = dispatches + 1, first_dispatched_at = coalesce(first_dispatched_at, now()), last_dispatched_at = now()"
	}
	if ch.undoDispatchMark {
		sets += `, dispatches = dispatches - 1, first_dispatched_at = CASE WHEN dispatches = 1 THEN NULL ELSE first_dispatched_at END,
			last_dispatched_at = CASE WHEN dispatches = 1 THEN NULL ELSE last_dispatched_at END`
	}
	if ch.errorCode != nil {
		args = append(args, *ch.errorCode)
		sets += fmt.Sprintf(", error_code = $%d", 4+len(args))
	}
	if ch.errorMessage != nil {
		args = append(args, *ch.errorMessage)
		sets += fmt.Sprintf(", error_message = $%d", 4+len(args))
	}
	if ch.reconciled {
		sets += ", reconciliations = reconciliations + 1"
	}
	if r := ch.result; r != nil {
		args = append(args, nz(r.providerRef), r.values)
		sets += fmt.Sprintf(", provider_ref = $%d, result = $%d", 3+len(args), 4+len(args))
	}
	return sets, args
}

// moveTx is the compare-and-set every transition goes through: it changes the state only
// if the row is still in from at this attempt (the fencing token), releases the lease
// when the intent leaves the in-flight states, and appends the event. It is one
// statement, so on the pool (outside a transaction) it is a transaction of its own.
func (s *pgStore) moveTx(ctx context.Context, tx interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, a *attempt, from, to State, reason string, ch change) error {
	sets, args := ch.sql()
	if !leaseKept(to) {
		sets = ", lease_owner = NULL, lease_until = NULL" + sets
	}
	// One statement: the compare-and-set, and its event only if the row moved.
	n := 4 + len(args)
	tag, err := tx.Exec(ctx, `WITH moved AS (
			UPDATE extworker_intents SET state = $1, updated_at = now()`+sets+`
			WHERE id = $2 AND state = $3 AND attempt = $4 RETURNING id)
		INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
		SELECT id, $3, $1, $4, `+fmt.Sprintf("$%d, $%d, $%d", n+1, n+2, n+3)+` FROM moved`,
		append(append([]any{to, a.row.ID, from, a.row.Attempt}, args...), actorOf(a.in.Task.Actor), nz(a.in.Task.TaskID), reason)...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("%w (%s -> %s at attempt %d)", ErrFenced, from, to, a.row.Attempt)
	}
	a.transitioned(ctx, from, to)
	return nil
}

// confirm is moveTx with the result; with Effect.Local or a compensated intent, in one
// transaction with them.
func (s *pgStore) confirm(ctx context.Context, a *attempt, from, to State, res Result, values []byte, reason string) error {
	wctx, cancel := a.writeCtx(ctx)
	defer cancel()
	a.pending = nil
	var err error
	if a.eff.Local == nil && a.row.CompensatesID == nil {
		// moveTx's one statement is a transaction of its own: one round trip, no BEGIN
		// and COMMIT.
		err = s.moveTx(wctx, s.pool, a, from, to, reason, change{result: &storedResult{res.ProviderRef, values}})
	} else {
		err = pgx.BeginFunc(wctx, s.pool, func(tx pgx.Tx) error {
			if err := s.moveTx(wctx, tx, a, from, to, reason, change{result: &storedResult{res.ProviderRef, values}}); err != nil {
				return err
			}
			if a.row.CompensatesID != nil {
				if err := s.compensateTx(wctx, tx, a, *a.row.CompensatesID, res.ProviderRef); err != nil {
					return err
				}
			}
			if a.eff.Local == nil {
				return nil
			}
			if err := a.eff.Local(wctx, tx, res); err != nil {
				return fmt.Errorf("%w: %w", errLocal, err)
			}
			return nil
		})
	}
	a.committed(err)
	return err
}

func (s *pgStore) inconclusive(ctx context.Context, a *attempt, counted int) error {
	wctx, cancel := a.writeCtx(ctx)
	defer cancel()
	_, err := s.pool.Exec(wctx, `UPDATE extworker_intents SET reconciliations = reconciliations + $3, lease_owner = NULL, lease_until = NULL,
			updated_at = now() WHERE id = $1 AND attempt = $2`, a.row.ID, a.row.Attempt, counted)
	return err
}

func (s *pgStore) releaseLease(ctx context.Context, a *attempt) {
	wctx, cancel := a.writeCtx(ctx)
	defer cancel()
	if _, err := s.pool.Exec(wctx, `UPDATE extworker_intents SET lease_owner = NULL, lease_until = NULL
		WHERE id = $1 AND attempt = $2 AND lease_until IS NOT NULL`, a.row.ID, a.row.Attempt); err != nil {
		a.logger(ctx).Warn("releasing an intent's lease failed; it runs out by itself", "ledger_state", string(a.row.State), "error", err)
	}
}

func (s *pgStore) event(ctx context.Context, tx pgx.Tx, a *attempt, from, to State, reason string) error {
	_, err := tx.Exec(ctx, `INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, a.row.ID, nz(string(from)), to, a.row.Attempt, actorOf(a.in.Task.Actor), nz(a.in.Task.TaskID), reason)
	return err
}

// tx runs fn in a transaction on pool that outlives a cancelled handler context: what
// the ledger learns must be written even when the handler's lock was just lost. fn gets
// the transaction's context (writeCtx), and runs its statements on it, never on ctx.
func (a *attempt) tx(ctx context.Context, pool *pgxpool.Pool, fn func(context.Context, pgx.Tx) error) error {
	wctx, cancel := a.writeCtx(ctx)
	defer cancel()
	a.pending = nil
	err := pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error { return fn(wctx, tx) })
	a.committed(err)
	return err
}
