package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// The writes each login may make on each ledger table (issue 23): everything else is
// refused with SQLSTATE 42501. A table the migrations add without an entry here fails
// TestRoleMatrix: decide what each role may do with it first.
var mayWrite = map[string]map[string][]string{
	testenv.WorkerLogin: {
		"extworker_intents":         {"INSERT", "UPDATE"},
		"extworker_intent_events":   {"INSERT"},
		"extworker_outbox":          {"INSERT", "UPDATE", "DELETE"},
		"extworker_inbox":           {"INSERT", "UPDATE", "DELETE"},
		"extworker_inbox_conflicts": {"INSERT", "UPDATE", "DELETE"},
		"extworker_inbox_starts":    {"INSERT", "UPDATE", "DELETE"},
		"extworker_inbox_callbacks": {"INSERT", "UPDATE", "DELETE"},
	},
	// Operators write nothing of the ledger or the inbox but through their functions
	// (`extworker inbox replay` and `reopen` through extworker_inbox_reopen): with UPDATE
	// on the inbox, one operator could mark a message handled that never was, or put a
	// handled one back to be acted on again.
	testenv.AliceLogin:    {},
	testenv.ConsoleLogin:  {},
	testenv.StrangerLogin: {},
}

// The SECURITY DEFINER functions each login may call.
var mayCall = map[string][]string{
	testenv.WorkerLogin:   {"extworker_inbox_reopen", "extworker_prune"},
	testenv.AliceLogin:    {"extworker_decide", "extworker_inbox_reopen", "extworker_prune", "extworker_resolve"},
	testenv.ConsoleLogin:  {"extworker_decide", "extworker_inbox_reopen", "extworker_prune", "extworker_resolve"},
	testenv.StrangerLogin: nil,
}

var writes = []string{"INSERT", "UPDATE", "DELETE", "TRUNCATE"}

// migrated returns a migrated ledger in a schema of its own, its owner's pool, and a
// function that opens a pool on it as a login.
func migrated(t *testing.T) (*pgxpool.Pool, string, func(login string) *pgxpool.Pool) {
	t.Helper()
	url := emptySchema(t)
	ctx := testenv.Context(t, time.Minute)
	_, err := migrations.Up(ctx, open(t, url))
	require.NoError(t, err)
	schema := url[strings.LastIndex(url, "=")+1:]
	as := func(login string) *pgxpool.Pool {
		testenv.DBAs(t, login) // fails in CI, skips elsewhere, when make up has not created the login
		p, err := pgxpool.New(ctx, testenv.DBURLAs(login)+"?search_path="+schema)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	owner, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(owner.Close)
	return owner, schema, as
}

// refused reports whether err is the database's refusal for want of a privilege.
func refused(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42501"
}

// TestRoleMatrix: for each login (a worker, an operator, the console, and one in no role,
// which may do what PUBLIC may) and each ledger, inbox, outbox and resolution table, each
// of INSERT, UPDATE, DELETE and TRUNCATE is refused for want of a privilege, or not, as
// mayWrite says; and each SECURITY DEFINER function is callable as mayCall says. Each
// statement runs in a transaction that is rolled back.
func TestRoleMatrix(t *testing.T) {
	t.Parallel()
	owner, schema, as := migrated(t)
	ctx := testenv.Context(t, 2*time.Minute)
	rows, err := owner.Query(ctx, `SELECT c.relname, (SELECT a.attname FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0
			AND NOT a.attisdropped ORDER BY a.attnum LIMIT 1)
		FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'r' ORDER BY 1`, schema)
	require.NoError(t, err)
	type table struct{ Name, Column string }
	tables, err := pgx.CollectRows(rows, pgx.RowToStructByPos[table])
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(tables), 11)

	cells := 0
	for login, allowed := range mayWrite {
		pool := as(login)
		for _, tb := range tables {
			for _, verb := range writes {
				// Qualified: a login without USAGE on the schema is refused, not told the
				// table does not exist.
				name := schema + "." + tb.Name
				stmt := map[string]string{
					"INSERT":   fmt.Sprintf(`INSERT INTO %s DEFAULT VALUES`, name),
					"UPDATE":   fmt.Sprintf(`UPDATE %s SET %s = %s WHERE false`, name, tb.Column, tb.Column),
					"DELETE":   fmt.Sprintf(`DELETE FROM %s WHERE false`, name),
					"TRUNCATE": fmt.Sprintf(`TRUNCATE %s`, name),
				}[verb]
				err := rolledBack(ctx, pool, stmt)
				want := contains(allowed[tb.Name], verb)
				assert.Equal(t, !want, refused(err), "%s: %s (%v)", login, stmt, err)
				cells++
			}
		}
		var callable []string
		rows, err := owner.Query(ctx, `SELECT DISTINCT p.proname FROM pg_proc p WHERE p.pronamespace = $1::regnamespace AND p.prosecdef
			AND has_function_privilege($2, p.oid, 'EXECUTE') ORDER BY 1`, schema, login)
		require.NoError(t, err)
		callable, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		want := append([]string(nil), mayCall[login]...)
		sort.Strings(want)
		assert.Equal(t, want, nilIfEmpty(callable), "%s: the SECURITY DEFINER functions it may call", login)
	}
	t.Logf("role matrix: %d logins x %d tables x %d statements = %d cells", len(mayWrite), len(tables), len(writes), cells)
}

func rolledBack(ctx context.Context, pool *pgxpool.Pool, stmt string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, stmt)
	return err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// TestSecurityDefinerFunctionsIgnoreTemporaryTables (issue 23, item 13): an operator's
// temporary table named like a ledger table does not stand in for it in the functions
// that run as the ledger's owner: prune does not turn a forged row into a tombstone, and
// a verdict lands on the real intent.
func TestSecurityDefinerFunctionsIgnoreTemporaryTables(t *testing.T) {
	t.Parallel()
	owner, _, as := migrated(t)
	ctx := testenv.Context(t, time.Minute)
	_, err := owner.Exec(ctx, `INSERT INTO extworker_operators (name, db_login) VALUES ('alice', $1)`, testenv.AliceLogin)
	require.NoError(t, err)
	_, err = owner.Exec(ctx, `INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state, amount)
		VALUES ('ns', 'payment.collect', 'real', 'd', 'ew_real', 'operator_hold', 100)`)
	require.NoError(t, err)

	conn, err := as(testenv.AliceLogin).Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, stmt := range []string{
		`CREATE TEMP TABLE extworker_intents (LIKE extworker_intents INCLUDING ALL)`,
		`CREATE TEMP TABLE extworker_intent_tombstones (LIKE extworker_intent_tombstones INCLUDING ALL)`,
		`CREATE TEMP TABLE extworker_ledger_settings (namespace text PRIMARY KEY, approval_threshold bigint)`,
		`INSERT INTO pg_temp.extworker_intents (id, namespace, scope, intent_key, request_digest, provider_key, state, updated_at)
			VALUES (424242, 'ns', 'payment.collect', 'forged', 'd', 'ew_forged', 'confirmed', now() - interval '400 days')`,
		`INSERT INTO pg_temp.extworker_intents (id, namespace, scope, intent_key, request_digest, provider_key, state, amount)
			VALUES (434343, 'ns', 'payment.collect', 'real', 'd', 'ew_real', 'operator_hold', 1)`,
		`INSERT INTO pg_temp.extworker_ledger_settings VALUES ('ns', 1000000)`,
	} {
		_, err := conn.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	var pruned int
	require.NoError(t, conn.QueryRow(ctx, `SELECT extworker_prune('ns', interval '30 days', 100)`).Scan(&pruned))
	assert.Zero(t, pruned)
	var tombstones int
	require.NoError(t, owner.QueryRow(ctx, `SELECT count(*) FROM extworker_intent_tombstones`).Scan(&tombstones))
	assert.Zero(t, tombstones, "no forged tombstone in the ledger")

	var status string
	require.NoError(t, conn.QueryRow(ctx, `SELECT status FROM extworker_resolve('ns', 'payment.collect', 'real', 'confirmed', 'ch_1',
		NULL, NULL, 'seen', NULL)`).Scan(&status))
	assert.Equal(t, "pending", status, "the real threshold (0) and the real amount (100): a second person is needed")
	var state string
	require.NoError(t, owner.QueryRow(ctx, `SELECT state FROM extworker_intents WHERE intent_key = 'real'`).Scan(&state))
	assert.Equal(t, "operator_hold", state)
}

// TestTenantsNameTheirOwnRoles (issue 23, item 4): a second ledger on the same cluster
// that names its own roles (SetRoles, EXTWORKER_DATABASE_ROLE_PREFIX) does not trust the
// first one's console login: it reads nothing and decides nothing there; its own console
// login is trusted to name its registered operators.
func TestTenantsNameTheirOwnRoles(t *testing.T) {
	t.Parallel()
	ownerB, schemaB, asB := migrated(t)
	ctx := testenv.Context(t, time.Minute)
	db := open(t, ownerB.Config().ConnString())
	granted, err := migrations.SetRoles(ctx, db, migrations.RolesFor("tenant_b"))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"tenant_b_worker", "tenant_b_operator"}, granted)
	roles, err := migrations.ReadRoles(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, migrations.RolesFor("tenant_b"), roles)
	_, err = ownerB.Exec(ctx, `INSERT INTO extworker_operators (name) VALUES ('bea'), ('ben')`)
	require.NoError(t, err)
	_, err = ownerB.Exec(ctx, `INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state, amount)
		VALUES ('ns', 'payment.collect', 'k', 'd', 'ew_k', 'operator_hold', 100)`)
	require.NoError(t, err)

	a := asB(testenv.ConsoleLogin)
	_, err = a.Exec(ctx, `SELECT * FROM `+schemaB+`.extworker_resolve('ns', 'payment.collect', 'k', 'confirmed', 'ch_1', NULL, NULL, 'seen', 'bea')`)
	assert.True(t, refused(err), "tenant A's console login decides nothing in tenant B's ledger: %v", err)
	_, err = a.Exec(ctx, `SELECT count(*) FROM `+schemaB+`.extworker_intents`)
	assert.True(t, refused(err), "nor reads it: %v", err)

	b := asB(testenv.TenantBConsoleLogin)
	var id int64
	var status string
	require.NoError(t, b.QueryRow(ctx, `SELECT resolution_id, status FROM extworker_resolve('ns', 'payment.collect', 'k', 'confirmed', 'ch_1',
		NULL, NULL, 'seen', 'bea')`).Scan(&id, &status))
	assert.Equal(t, "pending", status)
	_, err = b.Exec(ctx, `SELECT extworker_decide('ns', $1, true, 'mine', 'BEA')`, id)
	assert.ErrorContains(t, err, "may not approve it")
	require.NoError(t, b.QueryRow(ctx, `SELECT extworker_decide('ns', $1, true, 'checked', 'ben')`, id).Scan(&status))
	assert.Equal(t, "approved", status)
}

// TestHostileOperatorSQL: one person with one login (and a worker's login, and plain SQL)
// tries each way an outside tester found to move money alone (issue 23); each is refused
// by the database, and the held intent stays held.
func TestHostileOperatorSQL(t *testing.T) {
	t.Parallel()
	owner, _, as := migrated(t)
	ctx := testenv.Context(t, time.Minute)
	_, err := owner.Exec(ctx, `INSERT INTO extworker_operators (name, db_login) VALUES ('alice', $1), ('bob', $2)`, testenv.AliceLogin, testenv.BobLogin)
	require.NoError(t, err)
	hold := func(key string, orphaned bool) {
		_, err := owner.Exec(ctx, `INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state, amount, orphaned_at)
			VALUES ('ns', 'payment.collect', $1, 'd', 'ew_'||$1, 'operator_hold', 50000, CASE WHEN $2 THEN now() END)`, key, orphaned)
		require.NoError(t, err)
	}
	state := func(key string) (s string, closed bool) {
		require.NoError(t, owner.QueryRow(ctx, `SELECT state, orphan_closed_at IS NOT NULL FROM extworker_intents WHERE intent_key = $1`, key).Scan(&s, &closed))
		return s, closed
	}
	alice, worker := as(testenv.AliceLogin), as(testenv.WorkerLogin)
	request := func(key, verdict, ref string, values any) int64 {
		var id int64
		require.NoError(t, alice.QueryRow(ctx, `SELECT resolution_id FROM extworker_resolve('ns', 'payment.collect', $1, $2, $3, $4, NULL, 'seen', NULL)`,
			key, verdict, ref, values).Scan(&id))
		return id
	}

	t.Run("a decision that is neither approval nor rejection", func(t *testing.T) {
		hold("null-1", false)
		hold("null-2", true)
		for key, verdict := range map[string]string{"null-1": "confirmed", "null-2": "closed"} {
			ref := map[string]string{"confirmed": "ch_1"}[verdict]
			id := request(key, verdict, ref, nil)
			_, err := alice.Exec(ctx, `SELECT extworker_decide('ns', $1, NULL, 'x', NULL)`, id)
			assert.ErrorContains(t, err, "approves (true) or rejects (false)")
			s, closed := state(key)
			assert.Equal(t, "operator_hold", s)
			assert.False(t, closed)
		}
	})
	t.Run("a worker reshapes a held intent", func(t *testing.T) {
		hold("shape-1", true)
		for _, stmt := range []string{
			`UPDATE extworker_intents SET amount = 0 WHERE intent_key = 'shape-1'`,
			`UPDATE extworker_intents SET orphaned_at = NULL WHERE intent_key = 'shape-1'`,
			`UPDATE extworker_intents SET scope = 'payment.payout', intent_key = 'swapped' WHERE intent_key = 'shape-1'`,
			`UPDATE extworker_intents SET provider_key = 'pk_other', request_digest = 'other' WHERE intent_key = 'shape-1'`,
		} {
			_, err := worker.Exec(ctx, stmt)
			assert.True(t, refused(err), "%s: %v", stmt, err)
		}
	})
	t.Run("values the approver cannot see", func(t *testing.T) {
		hold("bidi-1", false)
		for _, c := range []struct {
			ref    string
			values any
		}{
			{"ch_ok\u200b", nil},
			{"ch_ok", map[string]any{"amount": "1\u202e00001"}},
			{"ch\u2066ok", nil},
			// What the console attack found still shown raw (issue 23, second round).
			{"ch\u00a012", nil},
			{"ch_\u034f12", nil},
			{"ch_12", map[string]any{"ref": "ch\ufe0f12"}},
			{"ch_12", map[string]any{"ref": "ch\u280012"}},
			{"ch\u3164x", nil},
			{"ch\u2003x", nil},
			{"ch\U000e0041x", nil},
		} {
			_, err := alice.Exec(ctx, `SELECT * FROM extworker_resolve('ns', 'payment.collect', 'bidi-1', 'confirmed', $1, $2, NULL, 'seen', NULL)`, c.ref, c.values)
			assert.ErrorContains(t, err, "control, format, invisible or space-like characters", "%+q %v", c.ref, c.values)
		}
		for _, ref := range []string{"ch_1  2", " ch_1", "ch_1 "} {
			_, err := alice.Exec(ctx, `SELECT * FROM extworker_resolve('ns', 'payment.collect', 'bidi-1', 'confirmed', $1, NULL, NULL, 'seen', NULL)`, ref)
			assert.ErrorContains(t, err, "may not begin or end with a space, nor hold two in a row", "%q", ref)
		}
		_, err := alice.Exec(ctx, `SELECT * FROM extworker_resolve('ns', 'payment.collect', 'bidi-1', 'prepared', 'ch_1', '{"a":1}', 'X', 'seen', NULL)`)
		assert.ErrorContains(t, err, "writes no provider reference, values or error code")
	})
	t.Run("an operator rewrites the inbox", func(t *testing.T) {
		_, err := owner.Exec(ctx, `INSERT INTO extworker_inbox (source, message_id, body_digest, state) VALUES
			('src', 'handled', 'd1', 'processed'), ('src', 'waiting', 'd2', 'received'), ('src', 'parked', 'd3', 'failed_final')`)
		require.NoError(t, err)
		for _, stmt := range []string{
			`UPDATE extworker_inbox SET state = 'received' WHERE message_id = 'handled'`,  // acted on again
			`UPDATE extworker_inbox SET state = 'processed' WHERE message_id = 'waiting'`, // never acted on
			`UPDATE extworker_inbox SET body_digest = 'd9' WHERE message_id = 'parked'`,   // another body replayed
			`UPDATE extworker_inbox SET reason = 'replayed by bob' WHERE message_id = 'parked'`,
		} {
			_, err := alice.Exec(ctx, stmt)
			assert.True(t, refused(err), "%s: %v", stmt, err)
		}
		var reopened bool
		require.NoError(t, alice.QueryRow(ctx, `SELECT extworker_inbox_reopen('src', 'handled', 'd1')`).Scan(&reopened))
		assert.False(t, reopened, "a handled message is not reopened")
		require.NoError(t, alice.QueryRow(ctx, `SELECT extworker_inbox_reopen('src', 'waiting', 'd2')`).Scan(&reopened))
		assert.False(t, reopened, "a waiting message is not reopened (an outside tester reopened one 20,000 times, its reason nested as often)")
		require.NoError(t, alice.QueryRow(ctx, `SELECT extworker_inbox_reopen('src', 'parked', 'd9')`).Scan(&reopened))
		assert.False(t, reopened, "a parked message is reopened only with its own body")
		require.NoError(t, alice.QueryRow(ctx, `SELECT extworker_inbox_reopen('src', 'parked', 'd3')`).Scan(&reopened))
		assert.True(t, reopened)
		var st, reason string
		var replays int
		require.NoError(t, owner.QueryRow(ctx, `SELECT state, reason, replays FROM extworker_inbox WHERE message_id = 'parked'`).Scan(&st, &reason, &replays))
		assert.Equal(t, "received", st)
		assert.Equal(t, "replayed by "+testenv.AliceLogin+" (was: )", reason, "the operator's own login, not the function's owner")
		assert.Equal(t, 1, replays)
		var waiting string
		require.NoError(t, owner.QueryRow(ctx, `SELECT coalesce(reason, '') FROM extworker_inbox WHERE message_id = 'waiting'`).Scan(&waiting))
		assert.Empty(t, waiting, "the waiting row untouched")

		// The console's login is shared by every console operator: its reopen names no one.
		_, err = owner.Exec(ctx, `UPDATE extworker_inbox SET state = 'failed_final' WHERE message_id = 'parked'`)
		require.NoError(t, err)
		_, err = as(testenv.ConsoleLogin).Exec(ctx, `SELECT extworker_inbox_reopen('src', 'parked', 'd3')`)
		assert.True(t, refused(err), "the console's login: %v", err)
		assert.ErrorContains(t, err, "names no person")
	})
	t.Run("a look-alike name", func(t *testing.T) {
		for _, name := range []string{"\u0430lice", "alice\u200b", " alice", "al ice", ""} {
			_, err := owner.Exec(ctx, `INSERT INTO extworker_operators (name) VALUES ($1)`, name)
			assert.ErrorContains(t, err, "extworker_operators_name_check", "%+q", name)
		}
	})
	t.Run("prune's minimum by a mixed interval", func(t *testing.T) {
		_, err := alice.Exec(ctx, `SELECT extworker_prune('ns', '-100 years 36001 days', 10)`)
		assert.ErrorContains(t, err, "is under a day")
	})
	t.Run("a negative amount", func(t *testing.T) {
		_, err := owner.Exec(ctx, `INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state, amount)
			VALUES ('ns', 'payment.collect', 'neg-1', 'd', 'ew_neg', 'operator_hold', -5)`)
		require.NoError(t, err)
		var status string
		require.NoError(t, alice.QueryRow(ctx, `SELECT status FROM extworker_resolve('ns', 'payment.collect', 'neg-1', 'confirmed', 'ch_1', NULL, NULL, 'seen', NULL)`).Scan(&status))
		assert.Equal(t, "pending", status)
	})
	t.Run("a worker closes an orphan or backdates an intent", func(t *testing.T) {
		hold("close-1", true)
		for _, stmt := range []string{
			`UPDATE extworker_intents SET orphan_closed_at = now() WHERE intent_key = 'close-1'`,
			`UPDATE extworker_intents SET updated_at = '2000-01-01' WHERE intent_key = 'close-1'`,
		} {
			_, err := worker.Exec(ctx, stmt)
			assert.True(t, refused(err), "%s: %v", stmt, err)
		}
		_, closed := state("close-1")
		assert.False(t, closed)
		_, err := worker.Exec(ctx, `UPDATE extworker_intents SET updated_at = now(), attempt = attempt WHERE intent_key = 'close-1'`)
		assert.NoError(t, err, "the ledger's own updates set now()")
	})
	t.Run("a forged event", func(t *testing.T) {
		for _, stmt := range []string{
			`INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, reason, db_user)
				SELECT id, 'operator_hold', 'confirmed', 0, 'operator:bob', 'approved by bob', 'extworker_bob' FROM extworker_intents WHERE intent_key = 'close-1'`,
			`INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, reason, at)
				SELECT id, 'operator_hold', 'confirmed', 0, 'worker', 'long ago', '2020-01-01' FROM extworker_intents WHERE intent_key = 'close-1'`,
		} {
			_, err := worker.Exec(ctx, stmt)
			assert.True(t, refused(err), "%s: %v", stmt, err)
		}
		_, err := worker.Exec(ctx, `INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, reason)
			SELECT id, 'operator_hold', 'operator_hold', 0, 'worker', 'a note' FROM extworker_intents WHERE intent_key = 'close-1'`)
		assert.NoError(t, err, "an event with the defaults is the worker's to write")
	})
	t.Run("characters the first round missed, named in full", func(t *testing.T) {
		hold("unseen-2", false)
		for ref, named := range map[string]string{"ch_\U0001D1731": "U+1D173", "ch_\uFFFC1": "U+FFFC", "ch_\U00016FE4": "U+16FE4",
			"ch_\U000E0001": "U+E0001", "ch_\U0001BCA0": "U+1BCA0", "ch_\U00013430": "U+13430"} {
			_, err := alice.Exec(ctx, `SELECT * FROM extworker_resolve('ns', 'payment.collect', 'unseen-2', 'confirmed', $1, NULL, NULL, 'seen', NULL)`, ref)
			assert.ErrorContains(t, err, "(found "+named+")", "%+q", ref)
		}
	})
	t.Run("ASCII look-alike names", func(t *testing.T) {
		for _, name := range []string{"aIice", "a1ice", "alice.", "ALICE", "b0b", "bob-"} {
			_, err := owner.Exec(ctx, `INSERT INTO extworker_operators (name) VALUES ($1)`, name)
			assert.ErrorContains(t, err, "extworker_operators_name_ci", "%q reads as alice or bob", name)
		}
	})
	t.Run("a second pending request", func(t *testing.T) {
		hold("twice-1", false)
		request("twice-1", "confirmed", "ch_1", nil)
		_, err := alice.Exec(ctx, `SELECT * FROM extworker_resolve('ns', 'payment.collect', 'twice-1', 'confirmed', 'ch_1', NULL, NULL, 'seen', NULL)`)
		assert.ErrorContains(t, err, "a resolution is already pending for payment.collect/twice-1")
	})
	t.Run("the grant functions", func(t *testing.T) {
		_, err := alice.Exec(ctx, `SELECT extworker_apply_grants()`)
		assert.True(t, refused(err), "%v", err)
	})
}
