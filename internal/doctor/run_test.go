package doctor_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/doctor"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// healthy sets a configuration every check passes with against the services make up
// starts: the engine on 8080, the migrated ledger as the worker's login, the broker, a
// free operations address. The tests then inject one problem each.
func healthy(t *testing.T) {
	t.Helper()
	testenv.Engine(t)
	testenv.DBAs(t, testenv.WorkerLogin)
	testenv.AMQP(t)
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURLAs(testenv.WorkerLogin))
	t.Setenv("EXTWORKER_AMQP_URL", testenv.AMQPURL())
	t.Setenv("EXTWORKER_HTTP_ADDR", testenv.FreeAddr(t))
}

// run loads the configuration from the environment and runs every check.
func run(t *testing.T, opts doctor.Options) map[string]doctor.Check {
	t.Helper()
	cfg, err := daemon.LoadConfig()
	require.NoError(t, err)
	ops, _, errs := daemon.ReadOpsConfig()
	require.Empty(t, errs)
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	checks := doctor.Run(testenv.Context(t, time.Minute), cfg, ops, opts)
	byName := map[string]doctor.Check{}
	for _, c := range checks {
		require.NotContains(t, byName, c.Name, "one check per name")
		byName[c.Name] = c
	}
	return byName
}

func requireCheck(t *testing.T, checks map[string]doctor.Check, name string) doctor.Check {
	t.Helper()
	c, found := checks[name]
	require.True(t, found, "check %q ran", name)
	return c
}

// queue declares an inbox queue with its companions, as its consumer does, deleted at
// cleanup.
func queue(t *testing.T) string {
	t.Helper()
	conn := testenv.AMQP(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	q := testenv.Unique("doctor")
	require.NoError(t, inbox.Declare(ch, inbox.Config{Queue: q}))
	t.Cleanup(func() {
		for _, name := range []string{q, inbox.RetryQueue(q), inbox.DeadLetterQueue(q)} {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	})
	return q
}

func TestHealthy(t *testing.T) {
	healthy(t)
	q := queue(t)
	checks := run(t, doctor.Options{Queues: []string{q}})
	for _, name := range []string{doctor.NameEngineReachable, doctor.NameEngineVersion, doctor.NameEngineCreds, doctor.NameClock,
		doctor.NameDatabase, doctor.NameMigrated, doctor.NameRoles, doctor.NameLogin, doctor.NameGrants, doctor.NameAMQP,
		doctor.NameQueue(q), doctor.NameLockLongPoll, doctor.NameShutdownLongPoll, doctor.NameAddress("EXTWORKER_HTTP_ADDR")} {
		assertStatus(t, requireCheck(t, checks, name), doctor.OK, "")
	}
	// Whether PUBLIC may connect is the cluster's: it is never a failure.
	assert.NotEqual(t, doctor.Fail, requireCheck(t, checks, doctor.NamePublicConnect).Status)
}

// An engine that does not answer fails its check, skips the two that need it, and stops
// no other check.
func TestEngineUnreachable(t *testing.T) {
	healthy(t)
	t.Setenv("EXTWORKER_ENGINE_URL", "http://127.0.0.1:1/engine-rest")
	checks := run(t, doctor.Options{})
	assertStatus(t, requireCheck(t, checks, doctor.NameEngineReachable), doctor.Fail, "check EXTWORKER_ENGINE_URL")
	for _, name := range []string{doctor.NameEngineVersion, doctor.NameEngineCreds} {
		c := requireCheck(t, checks, name)
		assert.Equal(t, doctor.Skip, c.Status, name)
		assert.Equal(t, "skipped: needs "+doctor.NameEngineReachable, c.Found)
	}
	assertStatus(t, requireCheck(t, checks, doctor.NameDatabase), doctor.OK, "")
	assertStatus(t, requireCheck(t, checks, doctor.NameGrants), doctor.OK, "")
	assertStatus(t, requireCheck(t, checks, doctor.NameClock), doctor.OK, "") // the database's clock alone

	// An engine's host and port with the wrong path: it answers, but not as an engine.
	t.Setenv("EXTWORKER_ENGINE_URL", strings.TrimSuffix(testenv.EngineURL(), "/engine-rest")+"/not-the-engine")
	checks = run(t, doctor.Options{})
	c := requireCheck(t, checks, doctor.NameEngineReachable)
	assertStatus(t, c, doctor.Fail, "the path …/engine-rest")
	assert.Contains(t, c.Found, "404")
	assert.Equal(t, doctor.Skip, requireCheck(t, checks, doctor.NameEngineCreds).Status)
}

// Credentials the engine refuses (the engine with REST authentication, on 8081) fail the
// credentials check with daemon.CheckClient's fix, the password shown nowhere.
func TestEngineCredentialsRefused(t *testing.T) {
	testenv.AuthEngine(t)
	healthy(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.AuthEngineURL())
	t.Setenv("EXTWORKER_ENGINE_USER", testenv.AuthEngineUser)
	t.Setenv("EXTWORKER_ENGINE_PASSWORD", "not-the-password")
	checks := run(t, doctor.Options{})
	assertStatus(t, requireCheck(t, checks, doctor.NameEngineReachable), doctor.OK, "")
	c := requireCheck(t, checks, doctor.NameEngineCreds)
	assertStatus(t, c, doctor.Fail, "check EXTWORKER_ENGINE_USER and EXTWORKER_ENGINE_PASSWORD")
	assert.Equal(t, doctor.Skip, requireCheck(t, checks, doctor.NameEngineVersion).Status)
	for _, c := range checks {
		assert.NotContains(t, c.Found+c.Fix, "not-the-password")
	}

	t.Setenv("EXTWORKER_ENGINE_USER", "")
	t.Setenv("EXTWORKER_ENGINE_PASSWORD", "")
	assertStatus(t, requireCheck(t, run(t, doctor.Options{}), doctor.NameEngineCreds), doctor.Fail, "requires authentication (401): set EXTWORKER_ENGINE_USER")

	t.Setenv("EXTWORKER_ENGINE_USER", testenv.AuthEngineUser)
	t.Setenv("EXTWORKER_ENGINE_PASSWORD", testenv.AuthEnginePassword)
	c = requireCheck(t, run(t, doctor.Options{}), doctor.NameEngineCreds)
	assertStatus(t, c, doctor.OK, "")
	assert.Equal(t, "accepted (basic, user admin)", c.Found)
}

// A token endpoint that does not answer is named as the cause, not the engine's URL.
func TestOAuthTokenEndpointDown(t *testing.T) {
	healthy(t)
	t.Setenv("EXTWORKER_ENGINE_OAUTH_TOKEN_URL", "http://127.0.0.1:1/token")
	t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_ID", "worker")
	t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET", "s3cret-client")
	checks := run(t, doctor.Options{})
	assertStatus(t, requireCheck(t, checks, doctor.NameEngineReachable), doctor.OK, "") // the engine itself answers
	c := requireCheck(t, checks, doctor.NameEngineCreds)
	assertStatus(t, c, doctor.Fail, "check EXTWORKER_ENGINE_OAUTH_TOKEN_URL")
	assert.Contains(t, c.Found, "connection refused")
	assert.NotContains(t, c.Fix, "EXTWORKER_ENGINE_URL")
	assert.Equal(t, doctor.Skip, requireCheck(t, checks, doctor.NameEngineVersion).Status)
	for _, c := range checks {
		assert.NotContains(t, c.Found+c.Fix, "s3cret-client")
	}
}

// An engine whose Date header is missing or not a date: its clock is unknown, a
// warning, not ok; a Date far off prints readably.
func TestEngineClockUnread(t *testing.T) {
	healthy(t)
	for _, tc := range []struct {
		date     []string
		status   doctor.Status
		found    string
		absentOK bool
	}{
		{nil, doctor.Warn, "engine unknown (its answer has no Date header)", true},
		{[]string{"garbage"}, doctor.Warn, `engine unknown (its Date header "garbage" is not an HTTP date)`, true},
		{[]string{"Sat, 01 Jan 2000 00:00:00 GMT"}, doctor.Fail, "engine 26y", false},
	} {
		engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Date"] = tc.date
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"version":"7.24.0"}`))
		}))
		t.Cleanup(engine.Close)
		t.Setenv("EXTWORKER_ENGINE_URL", engine.URL+"/engine-rest")
		checks := run(t, doctor.Options{})
		assertStatus(t, requireCheck(t, checks, doctor.NameEngineVersion), doctor.OK, "")
		c := requireCheck(t, checks, doctor.NameClock)
		assert.Equal(t, tc.status, c.Status, c.Found)
		assert.Contains(t, c.Found, tc.found)
		assert.Regexp(t, `engine 26y\d*d? behind|engine unknown`, c.Found)
	}
}

// The operator console, when EXTWORKER_CONSOLE_ADDR is set, is opened as `extworker
// console serve` opens it: each setting that stops it fails the check, with its fix.
func TestConsole(t *testing.T) {
	healthy(t)
	checks := run(t, doctor.Options{})
	assert.NotContains(t, checks, doctor.NameConsole, "no console configured, no check")

	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	hash := func(cost int) string {
		h, err := bcrypt.GenerateFromPassword([]byte("correct horse battery"), cost)
		require.NoError(t, err)
		return string(h)
	}
	good := file("good", "alice:"+hash(10)+"\n")
	t.Setenv("EXTWORKER_CONSOLE_ADDR", testenv.FreeAddr(t))
	t.Setenv("EXTWORKER_CONSOLE_OPERATORS_FILE", good)
	t.Setenv("EXTWORKER_CONSOLE_DATABASE_URL", testenv.DBURLAs(testenv.ConsoleLogin))
	assertStatus(t, requireCheck(t, run(t, doctor.Options{}), doctor.NameConsole), doctor.OK, "")

	for _, tc := range []struct {
		name, env, value, found, fix string
	}{
		{"missing operators file", "EXTWORKER_CONSOLE_OPERATORS_FILE", filepath.Join(dir, "absent"), "no such file", "exit 78"},
		{"empty operators file", "EXTWORKER_CONSOLE_OPERATORS_FILE", file("empty", "# nobody\n"), "no operators", "exit 78"},
		{"cheap hash", "EXTWORKER_CONSOLE_OPERATORS_FILE", file("cheap", "alice:"+hash(5)+"\n"), "bcrypt cost 5", "exit 78"},
		{"wrong console password", "EXTWORKER_CONSOLE_DATABASE_URL", strings.Replace(testenv.DBURLAs(testenv.ConsoleLogin),
			testenv.ConsoleLogin+":"+testenv.ConsoleLogin+"@", testenv.ConsoleLogin+":wrong-pw-4711@", 1), "password authentication failed", "check EXTWORKER_CONSOLE_DATABASE_URL"},
		{"login outside the console role", "EXTWORKER_CONSOLE_DATABASE_URL", testenv.DBURLAs(testenv.WorkerLogin), "not an operator's", "a login in the console's role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			checks := run(t, doctor.Options{})
			c := requireCheck(t, checks, doctor.NameConsole)
			assertStatus(t, c, doctor.Fail, tc.fix)
			assert.Contains(t, c.Found, tc.found)
			for _, c := range checks {
				assert.NotContains(t, c.Found+c.Fix, "wrong-pw-4711")
			}
		})
	}

	// A proxy's header, believed from anyone.
	t.Setenv("EXTWORKER_CONSOLE_OPERATORS_FILE", "")
	t.Setenv("EXTWORKER_CONSOLE_AUTH_HEADER", "X-Forwarded-User")
	t.Setenv("EXTWORKER_CONSOLE_TRUSTED_PROXIES", "0.0.0.0/0")
	c := requireCheck(t, run(t, doctor.Options{}), doctor.NameConsole)
	assertStatus(t, c, doctor.Fail, "exit 78")
	assert.Contains(t, c.Found, "too wide")
}

// scratchSchema returns the ledger database's URL (as its owner) with a new, empty
// schema first on the search path, dropped at cleanup.
func scratchSchema(t *testing.T) string {
	t.Helper()
	owner := testenv.DB(t)
	schema := "doctor_" + strings.ReplaceAll(testenv.Unique("s")[2:], "-", "_")
	_, err := owner.Exec(testenv.Context(t, 30*time.Second), `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = owner.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })
	return testenv.DBURL() + "?search_path=" + schema
}

// An unmigrated database is reported so, and left as it was: the doctor writes nothing
// (goose would create its version table).
func TestNotMigrated(t *testing.T) {
	healthy(t)
	url := scratchSchema(t)
	t.Setenv("EXTWORKER_DATABASE_URL", url)
	checks := run(t, doctor.Options{})
	assertStatus(t, requireCheck(t, checks, doctor.NameDatabase), doctor.OK, "")
	c := requireCheck(t, checks, doctor.NameMigrated)
	assertStatus(t, c, doctor.Fail, "run `extworker migrate`")
	assert.Contains(t, c.Found, "no table "+migrations.VersionTable)
	var tables []string
	schema := url[strings.LastIndex(url, "=")+1:]
	rows, err := testenv.DB(t).Query(testenv.Context(t, 10*time.Second), `SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace`, schema)
	require.NoError(t, err)
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		tables = append(tables, n)
	}
	require.NoError(t, rows.Err())
	assert.Empty(t, tables, "the doctor created nothing in %s", schema)
	for _, name := range []string{doctor.NameRoles, doctor.NameLogin, doctor.NameGrants, doctor.NamePublicConnect} {
		c := requireCheck(t, checks, name)
		assert.Equal(t, doctor.Skip, c.Status, name)
		assert.Equal(t, "skipped: needs "+doctor.NameMigrated, c.Found)
	}
}

// A version table the login may not read is a permission problem, not a ledger to
// migrate: the fix says to check the database and the login.
func TestMigrationsUnreadable(t *testing.T) {
	healthy(t)
	url := scratchSchema(t)
	schema := url[strings.LastIndex(url, "=")+1:]
	ctx := testenv.Context(t, time.Minute)
	owner := testenv.DB(t)
	_, err := owner.Exec(ctx, `CREATE TABLE `+schema+`.`+migrations.VersionTable+` (id serial, version_id bigint, is_applied boolean, tstamp timestamp);
		GRANT USAGE ON SCHEMA `+schema+` TO `+testenv.WorkerLogin)
	require.NoError(t, err)
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURLAs(testenv.WorkerLogin)+"?search_path="+schema)
	c := requireCheck(t, run(t, doctor.Options{}), doctor.NameMigrated)
	assertStatus(t, c, doctor.Fail, "the login may not read the ledger")
	assert.Contains(t, c.Found, "permission denied")
	assert.NotContains(t, c.Fix, "run `extworker migrate`")
}

// A grant the worker's role lost fails the grants check, naming it; roles the ledger
// names that do not exist fail the roles check, with the CREATE ROLE to run.
func TestMissingGrantAndRole(t *testing.T) {
	healthy(t)
	url := scratchSchema(t)
	t.Setenv("EXTWORKER_DATABASE_URL", url)
	ctx := testenv.Context(t, time.Minute)
	cfg, err := daemon.LoadConfig()
	require.NoError(t, err)
	require.NoError(t, daemon.Migrate(ctx, cfg, &strings.Builder{}))
	owner := testenv.DB(t)
	schema := url[strings.LastIndex(url, "=")+1:]
	_, err = owner.Exec(ctx, `REVOKE INSERT ON `+schema+`.extworker_intent_events FROM `+migrations.WorkerRole)
	require.NoError(t, err)

	checks := run(t, doctor.Options{})
	assertStatus(t, requireCheck(t, checks, doctor.NameMigrated), doctor.OK, "")
	assertStatus(t, requireCheck(t, checks, doctor.NameRoles), doctor.OK, "")
	c := requireCheck(t, checks, doctor.NameGrants)
	assertStatus(t, c, doctor.Fail, "run `extworker migrate` as the ledger's owner")
	assert.Equal(t, migrations.WorkerRole+" lacks INSERT ON extworker_intent_events", c.Found)
	assertStatus(t, requireCheck(t, checks, doctor.NameLogin), doctor.Warn, "IN ROLE "+migrations.WorkerRole) // the owner

	prefix := "doctor_" + strings.ReplaceAll(testenv.Unique("r")[2:], "-", "_")
	t.Setenv("EXTWORKER_DATABASE_ROLE_PREFIX", prefix)
	require.NoError(t, daemon.Migrate(ctx, mustLoad(t), &strings.Builder{})) // names roles nobody created
	checks = run(t, doctor.Options{})
	c = requireCheck(t, checks, doctor.NameRoles)
	assertStatus(t, c, doctor.Fail, "CREATE ROLE "+prefix+"_worker NOLOGIN")
	assert.Equal(t, "missing: "+prefix+"_worker, "+prefix+"_operator", c.Found)
	assert.Equal(t, "skipped: needs "+prefix+"_worker", requireCheck(t, checks, doctor.NameGrants).Found)
}

func mustLoad(t *testing.T) daemon.Config {
	t.Helper()
	cfg, err := daemon.LoadConfig()
	require.NoError(t, err)
	return cfg
}

// A broker that does not answer fails its check and skips the queues; a queue that was
// never declared fails its own.
func TestBroker(t *testing.T) {
	healthy(t)
	q := queue(t)
	t.Setenv("EXTWORKER_AMQP_URL", "amqp://extworker:hunter2x@127.0.0.1:1/extworker")
	checks := run(t, doctor.Options{Queues: []string{q}})
	c := requireCheck(t, checks, doctor.NameAMQP)
	assertStatus(t, c, doctor.Fail, "check EXTWORKER_AMQP_URL")
	assert.NotContains(t, c.Found, "hunter2x")
	assert.Equal(t, doctor.Skip, requireCheck(t, checks, doctor.NameQueue(q)).Status)

	t.Setenv("EXTWORKER_AMQP_URL", testenv.AMQPURL())
	absent := testenv.Unique("doctor-absent")
	checks = run(t, doctor.Options{Queues: []string{q, absent}})
	assertStatus(t, requireCheck(t, checks, doctor.NameQueue(q)), doctor.OK, "")
	assertStatus(t, requireCheck(t, checks, doctor.NameQueue(absent)), doctor.Fail, "start the worker that consumes "+absent)

	// A parked message is a warning.
	ch, err := testenv.AMQP(t).Channel()
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(testenv.Context(t, 10*time.Second), "", inbox.DeadLetterQueue(q), true, false, amqp.Publishing{Body: []byte("x")}))
	testenv.Eventually(t, 10*time.Second, "the parked message is counted", func() (bool, error) {
		return run(t, doctor.Options{Queues: []string{q}})[doctor.NameQueue(q)].Status == doctor.Warn, nil
	})
}

func TestKafka(t *testing.T) {
	healthy(t)
	t.Setenv("EXTWORKER_KAFKA_BROKERS", testenv.Kafka(t))
	assertStatus(t, requireCheck(t, run(t, doctor.Options{}), doctor.NameKafka), doctor.OK, "")
	t.Setenv("EXTWORKER_KAFKA_BROKERS", "127.0.0.1:1")
	c := requireCheck(t, run(t, doctor.Options{Timeout: 2 * time.Second}), doctor.NameKafka)
	assertStatus(t, c, doctor.Fail, "check EXTWORKER_KAFKA_BROKERS")
}

func TestAddressInUse(t *testing.T) {
	healthy(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	t.Setenv("EXTWORKER_HTTP_ADDR", ln.Addr().String())
	t.Setenv("EXTWORKER_CALLBACK_ADDR", testenv.FreeAddr(t))
	checks := run(t, doctor.Options{})
	c := requireCheck(t, checks, doctor.NameAddress("EXTWORKER_HTTP_ADDR"))
	assertStatus(t, c, doctor.Fail, "set EXTWORKER_HTTP_ADDR to a free address")
	assert.Contains(t, c.Found, "address already in use")
	assertStatus(t, requireCheck(t, checks, doctor.NameAddress("EXTWORKER_CALLBACK_ADDR")), doctor.OK, "")

	t.Setenv("EXTWORKER_HTTP_ADDR", "off")
	assertStatus(t, requireCheck(t, run(t, doctor.Options{}), doctor.NameAddress("EXTWORKER_HTTP_ADDR")), doctor.OK, "")
}

// The relations of the configuration in force, as loaded from the environment.
func TestRelationsOfTheConfiguration(t *testing.T) {
	healthy(t)
	t.Setenv("EXTWORKER_LOCK_DURATION", "10s")
	t.Setenv("EXTWORKER_LONG_POLL", "30s")
	t.Setenv("EXTWORKER_SHUTDOWN_GRACE", "5s")
	t.Setenv("EXTWORKER_SHUTDOWN_TIMEOUT", "20s")
	checks := run(t, doctor.Options{})
	assertStatus(t, requireCheck(t, checks, doctor.NameLockLongPoll), doctor.Warn, "EXTWORKER_LOCK_DURATION to at least EXTWORKER_LONG_POLL (30s)")
	assertStatus(t, requireCheck(t, checks, doctor.NameShutdownLongPoll), doctor.Warn, "EXTWORKER_SHUTDOWN_TIMEOUT longer than EXTWORKER_LONG_POLL (30s)")
}

// A database the doctor cannot reach gets the fix of its cause, against the real
// PostgreSQL: a wrong password, a database that does not exist, a port nothing listens
// on (the fix was one sentence for every cause).
func TestDatabaseUnreachableFixByCause(t *testing.T) {
	healthy(t)
	base, err := url.Parse(testenv.DBURLAs(testenv.WorkerLogin))
	require.NoError(t, err)
	with := func(edit func(u *url.URL)) string {
		u := *base
		edit(&u)
		return u.String()
	}
	for name, c := range map[string]struct{ url, fix string }{
		"wrong password":   {with(func(u *url.URL) { u.User = url.UserPassword(u.User.Username(), "not-the-password") }), "the password is wrong"},
		"no such database": {with(func(u *url.URL) { u.Path = "/" + testenv.Unique("nodb") }), "no such database"},
		"nothing listens":  {with(func(u *url.URL) { u.Host = testenv.FreeAddr(t) }), "nothing listens at that host and port"},
	} {
		t.Setenv("EXTWORKER_DATABASE_URL", c.url)
		checks := run(t, doctor.Options{})
		got := requireCheck(t, checks, doctor.NameDatabase)
		assertStatus(t, got, doctor.Fail, c.fix)
		assert.NotContains(t, got.Found+got.Fix, "not-the-password", name)
		assert.Equal(t, doctor.Skip, requireCheck(t, checks, doctor.NameMigrated).Status, name)
	}
}
