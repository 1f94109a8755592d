package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/extworker/extworker/idempotency"
)

// The seeded ledger: -rows intents in one namespace, spread over 90 days in the order
// they were recorded (ids, created_at and updated_at all grow together, as a ledger
// that has been written for 90 days has them), in three scopes, with keys unique across
// scopes (so `effects show KEY` without a scope finds one intent). States, by a hash of
// the row number: 0.05 % unknown, 0.05 % operator hold, 2 % rejected, 0.1 % reconciled,
// the rest confirmed. Every intent has -events events (3 by default: recorded,
// dispatched, settled, as the ledger writes them).
const seedSpan = 90 * 24 * time.Hour

var seedScopes = [...]string{"payment.collect", "invoice.send", "ledger.post"}

// seedState is row i's state.
func seedState(i int64) idempotency.State {
	switch h := mix(uint64(i)) % 100_000; {
	case h < 50:
		return idempotency.StateUnknown
	case h < 100:
		return idempotency.StateOperatorHold
	case h < 2100:
		return idempotency.StateRejected
	case h < 2200:
		return idempotency.StateReconciled
	}
	return idempotency.StateConfirmed
}

func seedScope(i int64) string { return seedScopes[i%int64(len(seedScopes))] }
func seedKey(i int64) string   { return fmt.Sprintf("ORD-%09d", i) }
func seedAmount(i int64) int64 { return 100 + i%100_000 }

// seedRequest is what a worker would send for row i: Do's Request, whose digest the row
// records, so a replay of a seeded key is a replay and not a digest mismatch.
func seedRequest(i int64) map[string]any {
	return map[string]any{"invoice": seedKey(i), "amount": seedAmount(i)}
}

// seedDigest is idempotency.Digest(seedRequest(i)) without its JSON round trips (ten
// million of them would add minutes of CPU to the seeding); checkDigests proves the two
// agree.
func seedDigest(i int64) string {
	sum := sha256.Sum256([]byte(`{"amount":` + strconv.FormatInt(seedAmount(i), 10) + `,"invoice":"` + seedKey(i) + `"}`))
	return hex.EncodeToString(sum[:])
}

func checkDigests() error {
	for _, i := range []int64{0, 1, 99_999, 1_234_567, 9_999_999} {
		d, err := idempotency.Digest(seedRequest(i))
		if err != nil {
			return err
		}
		if d != seedDigest(i) {
			return fmt.Errorf("seed digest of row %d is %s, idempotency.Digest says %s", i, seedDigest(i), d)
		}
	}
	return nil
}

// mix is splitmix64's finalizer: a cheap, well-spread hash of the row number.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// uuidOf is an engine-like id (Camunda's are random UUIDs) derived from a number.
func uuidOf(n uint64) string {
	a, b := mix(n), mix(n^0x5bd1e995)
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", a>>32, (a>>16)&0xffff, a&0xffff, b>>48, b&0xffffffffffff)
}

// seedInfo is what the report says about the seeded ledger.
type seedInfo struct {
	Reused                              bool
	Rows, Events                        int64
	Resolutions                         int64
	States                              map[idempotency.State]int64
	Copy, Indexes, Vacuum, Total        time.Duration
	Interrupted                         int // COPY chunks and index builds run again after a server restart
	DBBytes, Intents, EventsB, IndexesB int64
}

// ensureSeeded returns the seeded ledger: the database -db as a run with -keep left it,
// if it holds a ledger seeded with the same -rows and not pruned since, else seeded now.
func (s *server) ensureSeeded(ctx context.Context, o options, rep *report) (*ledgerDB, error) {
	if err := checkDigests(); err != nil {
		return nil, err
	}
	if ok, err := s.exists(ctx, o.db); err != nil {
		return nil, err
	} else if ok && !o.reseed {
		d, err := openLedgerDB(ctx, s.urlFor(o.db))
		if err != nil {
			return nil, err
		}
		var rows, events int64
		var secs, copySecs, indexSecs, vacuumSecs float64
		var interrupted int
		var pruned bool
		err = d.pool.QueryRow(ctx, `SELECT rows, events, seconds, copy_seconds, index_seconds, vacuum_seconds, interrupted, pruned
			FROM ledgerscale_seed`).Scan(&rows, &events, &secs, &copySecs, &indexSecs, &vacuumSecs, &interrupted, &pruned)
		if err == nil && rows == o.rows && events == o.rows*int64(o.eventsEach) && !pruned {
			progress("reusing %s: %d intents seeded earlier", o.db, rows)
			sec := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
			rep.seed = seedInfo{Reused: true, Rows: rows, Events: events, Total: sec(secs), Copy: sec(copySecs), Indexes: sec(indexSecs),
				Vacuum: sec(vacuumSecs), Interrupted: interrupted, States: seedStates(o.rows)}
			rep.seed.DBBytes, rep.seed.Intents, rep.seed.EventsB, rep.seed.IndexesB = d.size(ctx)
			_ = d.pool.QueryRow(ctx, `SELECT count(*) FROM extworker_resolutions`).Scan(&rep.seed.Resolutions)
			return d, nil
		}
		d.close()
	}
	if err := s.recreate(ctx, o.db); err != nil {
		return nil, err
	}
	d, err := openLedgerDB(ctx, s.urlFor(o.db))
	if err != nil {
		return nil, err
	}
	info, err := seed(ctx, d, o)
	if err != nil {
		d.close()
		return nil, fmt.Errorf("seed %s: %w", o.db, err)
	}
	rep.seed = info
	return d, nil
}

func seedStates(rows int64) map[idempotency.State]int64 {
	m := map[idempotency.State]int64{}
	for i := int64(0); i < rows; i++ {
		m[seedState(i)]++
	}
	return m
}

// seed fills the freshly migrated ledger d. The secondary indexes are dropped for the
// COPY and built again from their own definitions afterwards (building an index once is
// far cheaper than maintaining it row by row with a small shared_buffers), so the
// schema measured is exactly the migrations'; the primary keys and the unique
// constraint stay. VACUUM ANALYZE then leaves the tables as autovacuum would: hint bits
// set, visibility map current, statistics fresh.
func seed(ctx context.Context, d *ledgerDB, o options) (seedInfo, error) {
	info := seedInfo{Rows: o.rows, Events: o.rows * int64(o.eventsEach)}
	start := time.Now()
	var defs []string
	rows, err := d.pool.Query(ctx, `SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x
		JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
		WHERE t.relname IN ('extworker_intents', 'extworker_intent_events') AND t.relnamespace = 'public'::regnamespace
			AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = x.indexrelid) ORDER BY i.relname`)
	if err != nil {
		return info, err
	}
	var names []string
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			return info, err
		}
		names, defs = append(names, name), append(defs, def)
	}
	if err := rows.Err(); err != nil {
		return info, err
	}
	for _, name := range names {
		if _, err := d.pool.Exec(ctx, `DROP INDEX `+pgx.Identifier{name}.Sanitize()); err != nil {
			return info, err
		}
	}
	progress("seeding %d intents and %d events by COPY (secondary indexes %v built afterwards)", info.Rows, info.Events, names)
	now := time.Now().Truncate(time.Second)
	// The two tables are copied at once, on two connections (one COPY leaves the second
	// core idle), each in chunks of a million intents, each chunk its own transaction:
	// an interrupted chunk rolls back whole and is copied again.
	const chunk = 1_000_000
	interrupted := [2]int{}
	errs := make(chan error, 2)
	for t, copyChunk := range []func(from, to int64) error{
		func(from, to int64) error { return copyIntents(ctx, d, o.rows, from, to, now) },
		func(from, to int64) error { return copyEvents(ctx, d, o.rows, from, to, o.eventsEach, now) },
	} {
		go func() {
			for from := int64(0); from < o.rows; from += chunk {
				to := min(from+chunk, o.rows)
				if err := retrying(ctx, d.pool, fmt.Sprintf("COPY of rows %d to %d", from, to), &interrupted[t], func() error { return copyChunk(from, to) }); err != nil {
					errs <- err
					return
				}
				if t == 0 {
					progress("  intents: %d", to)
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			return info, err
		}
	}
	info.Interrupted = interrupted[0] + interrupted[1]
	info.Copy = time.Since(start)
	progress("COPY done in %v; building indexes", info.Copy.Round(time.Second))
	t := time.Now()
	for _, def := range defs {
		err := retrying(ctx, d.pool, def, &info.Interrupted, func() error {
			return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
				// A setting of this transaction only: the server's configuration is shared
				// and stays as it is.
				if _, err := tx.Exec(ctx, `SET LOCAL maintenance_work_mem = '256MB'`); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, def)
				return err
			})
		})
		if err != nil {
			return info, fmt.Errorf("%s: %w", def, err)
		}
	}
	// Every index dropped must be back, valid: migration 00007's is built CONCURRENTLY
	// by the migration, but here from pg_get_indexdef's plain CREATE INDEX, which leaves
	// no INVALID index behind (a failed build rolls back and is run again).
	after, err := d.checkIndexes(ctx)
	if err != nil {
		return info, err
	}
	back := map[string]bool{}
	for _, ix := range after {
		back[ix.Name] = true
	}
	for _, name := range names {
		if !back[name] {
			return info, fmt.Errorf("index %s was dropped for the COPY and is not back", name)
		}
	}
	if !slices.Contains(names, "extworker_intents_prunable") {
		return info, fmt.Errorf("index extworker_intents_prunable (migration 00007) was not among the indexes rebuilt after the COPY: %v", names)
	}
	if _, err := d.pool.Exec(ctx, `SELECT setval('extworker_intents_id_seq', $1), setval('extworker_intent_events_id_seq', $2)`,
		o.rows, info.Events); err != nil {
		return info, err
	}
	info.Indexes = time.Since(t)
	// The operators' resolution requests: one approved for every reconciled intent (an
	// operator's verdict, approved by a second), one pending for every held one.
	if err := retrying(ctx, d.pool, "seed resolutions", &info.Interrupted, func() error {
		_, err := d.pool.Exec(ctx, `TRUNCATE extworker_resolutions`)
		if err == nil {
			err = d.pool.QueryRow(ctx, `WITH r AS (
				INSERT INTO extworker_resolutions (intent_id, namespace, scope, intent_key, from_state, attempt, verdict, provider_ref,
					reason, requested_by, requested_at, status, decided_by, decided_db_user, decided_at, decision_reason)
				SELECT id, namespace, scope, intent_key, 'unknown', attempt, 'confirmed', 'ch_' || intent_key,
					'found at the provider', 'alice', updated_at - interval '1 hour',
					CASE WHEN state = 'reconciled' THEN 'approved' ELSE 'pending' END,
					CASE WHEN state = 'reconciled' THEN 'bob' END, CASE WHEN state = 'reconciled' THEN 'extworker' END,
					CASE WHEN state = 'reconciled' THEN updated_at END, CASE WHEN state = 'reconciled' THEN 'agreed' END
				FROM extworker_intents WHERE state IN ('reconciled', 'operator_hold') ORDER BY id
				RETURNING 1)
				SELECT count(*) FROM r`).Scan(&info.Resolutions)
		}
		return err
	}); err != nil {
		return info, err
	}
	progress("indexes built in %v, %d resolutions; VACUUM ANALYZE", info.Indexes.Round(time.Second), info.Resolutions)
	t = time.Now()
	if err := retrying(ctx, d.pool, "VACUUM ANALYZE", &info.Interrupted, func() error {
		_, err := d.pool.Exec(ctx, `VACUUM (ANALYZE) extworker_intents, extworker_intent_events, extworker_resolutions`)
		return err
	}); err != nil {
		return info, err
	}
	info.Vacuum = time.Since(t)
	info.Total = time.Since(start)
	info.States = seedStates(o.rows)
	// What a later run with the same -rows reuses, and reports.
	if _, err := d.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledgerscale_seed (rows bigint, events bigint, seconds float8,
		copy_seconds float8, index_seconds float8, vacuum_seconds float8, interrupted integer, pruned boolean NOT NULL DEFAULT false)`); err != nil {
		return info, err
	}
	if _, err := d.pool.Exec(ctx, `DELETE FROM ledgerscale_seed`); err != nil {
		return info, err
	}
	if _, err := d.pool.Exec(ctx, `INSERT INTO ledgerscale_seed (rows, events, seconds, copy_seconds, index_seconds, vacuum_seconds, interrupted)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, info.Rows, info.Events, info.Total.Seconds(), info.Copy.Seconds(), info.Indexes.Seconds(),
		info.Vacuum.Seconds(), info.Interrupted); err != nil {
		return info, err
	}
	info.DBBytes, info.Intents, info.EventsB, info.IndexesB = d.size(ctx)
	progress("seeded in %v: database %s", info.Total.Round(time.Second), bytesText(info.DBBytes))
	return info, nil
}

// seedTimes are row i's creation and last change: evenly spread over seedSpan up to
// now, the change a second after the creation.
func seedTimes(i, rows int64, now time.Time) (created, updated time.Time) {
	created = now.Add(-seedSpan + time.Duration(float64(seedSpan)*float64(i)/float64(rows)))
	return created, created.Add(time.Second)
}

var intentColumns = []string{"id", "namespace", "scope", "intent_key", "request_digest", "provider_key", "state", "attempt",
	"dispatches", "reconciliations", "provider_ref", "result", "error_code", "error_message", "task_id", "process_instance_id",
	"business_key", "first_dispatched_at", "last_dispatched_at", "created_at", "updated_at", "amount"}

// copyIntents copies intents from to to (row numbers; ids are one higher).
func copyIntents(ctx context.Context, d *ledgerDB, rows, from, to int64, now time.Time) error {
	src := &intentSource{rows: rows, end: to, now: now, i: from - 1, vals: make([]any, len(intentColumns))}
	_, err := d.pool.CopyFrom(ctx, pgx.Identifier{"extworker_intents"}, intentColumns, src)
	return err
}

// intentSource generates the intents for CopyFrom, one row at a time.
type intentSource struct {
	rows, end, i int64
	now          time.Time
	vals         []any
}

func (s *intentSource) Next() bool {
	s.i++
	return s.i < s.end
}

func (s *intentSource) Err() error { return nil }

func (s *intentSource) Values() ([]any, error) {
	i := s.i
	scope, key, st := seedScope(i), seedKey(i), seedState(i)
	created, updated := seedTimes(i, s.rows, s.now)
	dispatched := created.Add(50 * time.Millisecond)
	var ref, result, code, msg *string
	reconciliations := int32(0)
	switch st {
	case idempotency.StateConfirmed, idempotency.StateReconciled:
		r := "ch_" + strconv.FormatInt(i, 36)
		j := `{"charge_id":"` + r + `"}`
		ref, result = &r, &j
	case idempotency.StateRejected:
		c, m := "card_declined", "Your card was declined."
		code, msg = &c, &m
	case idempotency.StateOperatorHold:
		m := "still unknown after 5 reconciliations: provider timeout"
		msg, reconciliations = &m, 5
	}
	task, pi := uuidOf(uint64(2*i)), uuidOf(uint64(2*i+1))
	v := s.vals
	v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7] = i+1, namespace, scope, key, seedDigest(i), idempotency.ProviderKey(namespace, scope, key), string(st), int32(1)
	v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15] = int32(1), reconciliations, ref, result, code, msg, task, pi
	v[16], v[17], v[18], v[19], v[20], v[21] = key, dispatched, dispatched, created, updated, seedAmount(i)
	return v, nil
}

var eventColumns = []string{"id", "intent_id", "at", "from_state", "to_state", "attempt", "actor", "task_id", "reason", "db_user"}

// copyEvents copies the events of intents from to to.
func copyEvents(ctx context.Context, d *ledgerDB, rows, from, to int64, each int, now time.Time) error {
	src := &eventSource{rows: rows, each: int64(each), end: to * int64(each), now: now, n: from*int64(each) - 1, vals: make([]any, len(eventColumns))}
	_, err := d.pool.CopyFrom(ctx, pgx.Identifier{"extworker_intent_events"}, eventColumns, src)
	return err
}

// eventSource generates each intent's events: recorded, dispatched, then the transition
// to its state (more than three repeat the last, as reconciliations would).
type eventSource struct {
	rows, each, end, n int64
	now                time.Time
	vals               []any
}

func (s *eventSource) Next() bool {
	s.n++
	return s.n < s.end
}

func (s *eventSource) Err() error { return nil }

var (
	stPrepared   = string(idempotency.StatePrepared)
	stDispatched = string(idempotency.StateDispatched)
)

func (s *eventSource) Values() ([]any, error) {
	i, k := s.n/s.each, s.n%s.each
	created, updated := seedTimes(i, s.rows, s.now)
	task := uuidOf(uint64(2 * i))
	v := s.vals
	v[0], v[1], v[6], v[7], v[9] = s.n+1, i+1, "worker-1", task, "extworker"
	switch {
	case k == 0:
		v[2], v[3], v[4], v[5], v[8] = created, nil, stPrepared, int32(0), "intent recorded"
	case k == 1:
		v[2], v[3], v[4], v[5], v[8] = created.Add(time.Millisecond), &stPrepared, stDispatched, int32(1), "dispatching with the provider key"
	default:
		st := string(seedState(i))
		v[2], v[3], v[4], v[5], v[8] = updated, &stDispatched, st, int32(1), "settled: "+st
	}
	return v, nil
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d kB", n>>10)
}
