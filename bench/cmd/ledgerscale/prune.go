package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/idempotency"
)

// pruneInfo is what the report says about the prune.
type pruneInfo struct {
	Retention          time.Duration
	Prunable           int64 // settled, not orphaned, older than the retention, before the prune
	Pruned             int64
	Took               time.Duration
	For                time.Duration // the prune's time limit
	Stopped            bool          // For ran out first
	Err                string
	Baseline, During   stats
	BaselineN, DuringN int
	// Lock waits of the claimers' sessions, sampled from pg_stat_activity every 50 ms:
	// samples in which at least one claimer waited on a lock, of all samples.
	WaitSamples, Samples int
	WaitEvents           map[string]int
	// What the prune's own session waited on, by wait event, in the same samples.
	PruneWaits map[string]int
	// Interruptions by the server going away: of the prune (it went on afterwards), and
	// of claims (not counted as latencies).
	PruneInterrupted  int
	ClaimsInterrupted atomic.Int64
}

// prune measures claims without a prune (-baseline long), then prunes the seeded ledger
// with the ledger's own Prune (batches of 1,000, each its own transaction) while the
// same claimers keep recording new side effects, until the prune ends or -prune-for has
// passed. The claimers and the prune have pools of their own (application_name tells
// their sessions apart in pg_stat_activity), on the seeded ledger's database.
func prune(ctx context.Context, o options, seeded *ledgerDB, info *pruneInfo, pruneFor time.Duration) error {
	info.Retention = o.retention
	if err := seeded.pool.QueryRow(ctx, `SELECT count(*) FROM extworker_intents WHERE namespace = $1
		AND state IN ('confirmed', 'rejected', 'reconciled', 'compensated') AND orphaned_at IS NULL
		AND updated_at < now() - $2::bigint * interval '1 microsecond'`, namespace, o.retention.Microseconds()).Scan(&info.Prunable); err != nil {
		return err
	}
	dbURL := seeded.pool.Config().ConnString()
	claimPool, claimLedger, err := appLedger(ctx, dbURL, "ledgerscale-claims")
	if err != nil {
		return err
	}
	defer claimPool.Close()
	prunePool, pruneLedger, err := appLedger(ctx, dbURL, "ledgerscale-prune")
	if err != nil {
		return err
	}
	defer prunePool.Close()

	runID := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff)
	var seq atomic.Int64
	// claim runs the claimers until stop is closed and returns their latencies.
	claim := func(stop <-chan struct{}) ([]time.Duration, error) {
		var mu sync.Mutex
		var all []time.Duration
		var firstErr error
		var wg sync.WaitGroup
		for range o.claimers {
			wg.Go(func() {
				eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
					return idempotency.Result{ProviderRef: "ch"}, nil
				}}
				var mine []time.Duration
				for {
					select {
					case <-stop:
						mu.Lock()
						all = append(all, mine...)
						mu.Unlock()
						return
					default:
					}
					n := seq.Add(1)
					key := fmt.Sprintf("CLAIM-%s-%07d", runID, n)
					t0 := time.Now()
					_, err := claimLedger.Do(ctx, idempotency.Intent{Scope: "payment.collect", Key: key, Request: newRequest(key), Task: task(key, uint64(n))}, eff)
					d := time.Since(t0)
					if interruption(err) {
						// The server went away (see retry.go): not a claim's latency.
						info.ClaimsInterrupted.Add(1)
						_ = waitForServer(ctx, claimPool)
						continue
					}
					mine = append(mine, d)
					if err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						<-stop
					}
				}
			})
		}
		wg.Wait()
		return all, firstErr
	}

	progress("prune: %d intents are prunable (retention %v); %d claimers for %v without a prune first", info.Prunable, o.retention, o.claimers, o.baseline)
	stop := make(chan struct{})
	time.AfterFunc(o.baseline, func() { close(stop) })
	base, err := claim(stop)
	if err != nil {
		return fmt.Errorf("claims without a prune: %w", err)
	}
	info.Baseline, info.BaselineN = statsOf(&sample{d: base}), len(base)

	progress("prune: pruning (at most %v) while %d claimers keep claiming", pruneFor, o.claimers)
	stop = make(chan struct{})
	pctx, pcancel := context.WithTimeout(ctx, pruneFor)
	defer pcancel()
	sampled := make(chan struct{})
	info.WaitEvents, info.PruneWaits = map[string]int{}, map[string]int{}
	go func() {
		defer close(sampled)
		sampleWaits(ctx, seeded.pool, stop, info)
	}()
	var during []time.Duration
	var claimErr error
	claimed := make(chan struct{})
	go func() {
		during, claimErr = claim(stop)
		close(claimed)
	}()
	t0 := time.Now()
	var n int64
	var perr error
	for {
		var m int64
		m, perr = pruneLedger.Operations().Prune(pctx, o.retention)
		n += m
		if !interruption(perr) {
			break
		}
		// The prune's batches are transactions of their own: what it pruned stays pruned,
		// and it goes on from there once the server is back.
		info.PruneInterrupted++
		if err := waitForServer(pctx, prunePool); err != nil {
			perr = err
			break
		}
	}
	info.Took, info.Pruned, info.For = time.Since(t0), n, pruneFor
	close(stop)
	<-claimed
	<-sampled
	switch {
	case perr != nil && errors.Is(pctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
		info.Stopped = true
	case perr != nil:
		info.Err = perr.Error()
	}
	if claimErr != nil {
		return fmt.Errorf("claims during the prune: %w", claimErr)
	}
	info.During, info.DuringN = statsOf(&sample{d: during}), len(during)
	progress("prune: %d intents in %v (%.0f/s), stopped by -prune-for: %v", n, info.Took.Round(time.Second), float64(n)/info.Took.Seconds(), info.Stopped)
	return nil
}

// appLedger is a ledger on a pool of its own whose sessions carry application_name.
func appLedger(ctx context.Context, dbURL, app string) (*pgxpool.Pool, *idempotency.Ledger, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	l, err := idempotency.New(pool, idempotency.Config{Namespace: namespace})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, l, nil
}

// sampleWaits samples what the claimers' and the prune's sessions wait on, every 50 ms,
// until stop is closed.
func sampleWaits(ctx context.Context, pool *pgxpool.Pool, stop <-chan struct{}, info *pruneInfo) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rows, err := pool.Query(ctx, `SELECT application_name, coalesce(wait_event_type, ''), coalesce(wait_event, '')
			FROM pg_stat_activity WHERE datname = current_database() AND state = 'active'
				AND application_name IN ('ledgerscale-claims', 'ledgerscale-prune')`)
		if err != nil {
			continue
		}
		waited := false
		for rows.Next() {
			var app, typ, ev string
			if rows.Scan(&app, &typ, &ev) != nil {
				continue
			}
			switch {
			case app == "ledgerscale-prune":
				if typ == "" {
					typ, ev = "CPU", "running"
				}
				info.PruneWaits[typ+": "+ev]++
			case typ == "Lock" || typ == "LWLock":
				waited = waited || typ == "Lock"
				info.WaitEvents[typ+": "+ev]++
			}
		}
		rows.Close()
		info.Samples++
		if waited {
			info.WaitSamples++
		}
	}
}

// explainSlow runs EXPLAIN (ANALYZE, BUFFERS) on the seeded ledger for the queries that
// were slow at 10 M intents before migration 00007 and the List rewrite, and for the
// lookup by scope and key that migration 00008 moved onto the unique index: Get, List
// by key without a scope (findIntent's), List of unknowns, one batch of the prune's victims.
// The SQL is what idempotency sends (operator.go's List builds its WHERE from the
// filters that are set, one state compared with =; migration 00003's extworker_prune),
// with the values the measured calls use; it is run in a transaction rolled back at
// once, so the prune's FOR UPDATE locks nothing for long and nothing changes.
func explainSlow(ctx context.Context, d *ledgerDB, retention time.Duration) []explained {
	const (
		listByKey  = `SELECT * FROM extworker_intents WHERE namespace = $1 AND intent_key = $2 ORDER BY updated_at DESC LIMIT $3`
		getByScope = `SELECT * FROM extworker_intents WHERE namespace = $1 AND scope = $2 AND intent_key = $3`
		listState  = `SELECT * FROM extworker_intents WHERE namespace = $1 AND state = $2 ORDER BY updated_at DESC LIMIT $3`
		victims    = `SELECT id FROM extworker_intents
		WHERE namespace = $1 AND state IN ('confirmed', 'rejected', 'reconciled', 'compensated')
			AND orphaned_at IS NULL AND updated_at < now() - $2::bigint * interval '1 microsecond'
		ORDER BY updated_at LIMIT 1000 FOR UPDATE SKIP LOCKED`
	)
	key := seedKey(242)
	cases := []struct {
		what, sql string
		args      []any
	}{
		{"Get by scope and key (a replay's read-back, effects show KEY --scope S)", getByScope, []any{namespace, seedScope(242), key}},
		{"List by key without a scope (effects show KEY)", listByKey, []any{namespace, key, 1000}},
		{"List of unknowns (effects list --state unknown)", listState, []any{namespace, "unknown", 100}},
		{"one prune batch's victims (extworker_prune)", victims, []any{namespace, retention.Microseconds()}},
	}
	var out []explained
	for _, c := range cases {
		e := explained{What: c.what}
		err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
			// The simple protocol sends the values inline: the plan is the one the server
			// makes for these values (a custom plan), as for the measured calls' first
			// executions.
			rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+c.sql, append([]any{pgx.QueryExecModeSimpleProtocol}, c.args...)...)
			if err != nil {
				return err
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			e.Plan = strings.Join(lines, "\n")
			if err != nil {
				return err
			}
			return errRollback
		})
		if err != nil && !errors.Is(err, errRollback) {
			e.Plan = "EXPLAIN failed: " + err.Error()
		}
		out = append(out, e)
	}
	return out
}

var errRollback = errors.New("rollback")

type explained struct{ What, Plan string }
