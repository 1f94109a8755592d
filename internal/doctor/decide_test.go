package doctor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/doctor"
	"github.com/extworker/extworker/migrations"
)

// assertStatus asserts c's status and, for a check that is not ok, that its fix says
// fixHas.
func assertStatus(t *testing.T, c doctor.Check, want doctor.Status, fixHas string) {
	t.Helper()
	assert.Equal(t, want, c.Status, "%s: %s", c.Name, c.Found)
	if want == doctor.OK {
		assert.Empty(t, c.Fix, c.Name)
		return
	}
	assert.Contains(t, c.Fix, fixHas, c.Name)
}

func TestEngineVersion(t *testing.T) {
	assertStatus(t, doctor.EngineVersion("7.24.0"), doctor.OK, "")
	assertStatus(t, doctor.EngineVersion("7.20.0-ee"), doctor.OK, "")
	assertStatus(t, doctor.EngineVersion("1.0.0"), doctor.OK, "") // Operaton numbers anew
	assertStatus(t, doctor.EngineVersion("7.19.0"), doctor.Warn, "upgrade the engine")
	assertStatus(t, doctor.EngineVersion("<html>"), doctor.Warn, "EXTWORKER_ENGINE_URL")
}

func ptr(d time.Duration) *time.Duration { return &d }

func TestClockSkew(t *testing.T) {
	assert.Equal(t, doctor.Skip, doctor.ClockSkew(nil, nil).Status)
	assert.Contains(t, doctor.ClockSkew(nil, nil).Found, "skipped: needs")
	assertStatus(t, doctor.ClockSkew(ptr(900*time.Millisecond), ptr(-200*time.Millisecond)), doctor.OK, "")
	assertStatus(t, doctor.ClockSkew(nil, ptr(doctor.WarnSkew)), doctor.Warn, "NTP")
	// Each clock is 40s off this host's, in opposite directions: 80s between them.
	c := doctor.ClockSkew(ptr(40*time.Second), ptr(-40*time.Second))
	assertStatus(t, c, doctor.Fail, "NTP")
	assert.Contains(t, c.Found, "engine-database 1m20s ahead")

	// Large skews print readably, not as seconds.
	c = doctor.ClockSkew(ptr(-(26*8766*time.Hour + 3*24*time.Hour)), nil)
	assertStatus(t, c, doctor.Fail, "NTP")
	assert.Equal(t, "engine 26y behind (against this host)", c.Found)
	assert.Equal(t, "engine 3m20s ahead (against this host)", doctor.ClockSkew(ptr(200*time.Second), nil).Found)
	assert.Equal(t, "database 2d5h behind (against this host)", doctor.ClockSkew(nil, ptr(-53*time.Hour)).Found)

	// An engine whose clock could not be read is a warning, even with the database's in time.
	c = doctor.Clock(doctor.ClockFacts{EngineUnknown: "its answer has no Date header", Database: ptr(0)})
	assertStatus(t, c, doctor.Warn, "Date header")
	assert.Equal(t, "engine unknown (its answer has no Date header), database +0.0s (against this host)", c.Found)
}

func TestRelations(t *testing.T) {
	base := daemon.Config{LockDuration: 20 * time.Second, LongPoll: 20 * time.Second, ShutdownGrace: 30 * time.Second,
		ShutdownTimeout: 45 * time.Second, LedgerLease: 2 * time.Minute}
	for _, c := range doctor.Relations(base) {
		assertStatus(t, c, doctor.OK, "")
	}

	short := base
	short.LockDuration = 10 * time.Second
	c := doctor.Relations(short)[0]
	assert.Equal(t, doctor.NameLockLongPoll, c.Name)
	assertStatus(t, c, doctor.Warn, "EXTWORKER_LOCK_DURATION to at least EXTWORKER_LONG_POLL (20s)")

	stop := base
	stop.LongPoll, stop.LockDuration = time.Minute, time.Minute
	c = doctor.Relations(stop)[1]
	assert.Equal(t, doctor.NameShutdownLongPoll, c.Name)
	assertStatus(t, c, doctor.Warn, "EXTWORKER_SHUTDOWN_TIMEOUT longer than EXTWORKER_LONG_POLL (1m0s)")

	noPoll := stop
	noPoll.LongPoll = 0 // no pending poll to wait for
	assertStatus(t, doctor.Relations(noPoll)[1], doctor.OK, "")
}

func TestRoles(t *testing.T) {
	r := migrations.RolesFor("extworker")
	all := map[string]bool{r.Worker: true, r.Operator: true, r.Console: true}
	assertStatus(t, doctor.Roles(doctor.RoleFacts{Ledger: r, Configured: r, Exists: all}), doctor.OK, "")

	c := doctor.Roles(doctor.RoleFacts{Ledger: r, Configured: migrations.RolesFor("tenant_b"), Exists: all})
	assertStatus(t, c, doctor.Fail, "EXTWORKER_DATABASE_ROLE_PREFIX")

	noConsole := map[string]bool{r.Worker: true, r.Operator: true}
	assertStatus(t, doctor.Roles(doctor.RoleFacts{Ledger: r, Configured: r, Exists: noConsole}), doctor.OK, "")
	c = doctor.Roles(doctor.RoleFacts{Ledger: r, Configured: r, Exists: noConsole, Console: true})
	assertStatus(t, c, doctor.Fail, "CREATE ROLE extworker_console NOLOGIN")

	c = doctor.Roles(doctor.RoleFacts{Ledger: r, Configured: r, Exists: map[string]bool{r.Worker: true}})
	assertStatus(t, c, doctor.Fail, "CREATE ROLE extworker_operator NOLOGIN")
	assert.Equal(t, "missing: extworker_operator", c.Found)
}

func TestLogin(t *testing.T) {
	assertStatus(t, doctor.Login(doctor.LoginFacts{Login: "app", WorkerRole: "w", Member: true}), doctor.OK, "")
	assertStatus(t, doctor.Login(doctor.LoginFacts{Login: "owner", WorkerRole: "w", Member: true, Owner: true}), doctor.Warn, "IN ROLE w")
	assertStatus(t, doctor.Login(doctor.LoginFacts{Login: "stranger", WorkerRole: "w"}), doctor.Fail, "GRANT w TO stranger")
}

func TestGrants(t *testing.T) {
	held := map[doctor.Grant]bool{}
	for _, g := range doctor.WorkerGrants {
		held[g] = true
	}
	assertStatus(t, doctor.Grants("w", doctor.WorkerGrants, held), doctor.OK, "")
	held[doctor.Grant{Object: "extworker_intent_events", Privilege: "INSERT"}] = false
	held[doctor.Grant{Object: "extworker_prune(text, interval, integer)", Privilege: "EXECUTE"}] = false
	c := doctor.Grants("w", doctor.WorkerGrants, held)
	assertStatus(t, c, doctor.Fail, "extworker migrate")
	assert.Equal(t, "w lacks EXECUTE ON extworker_prune(text, interval, integer), INSERT ON extworker_intent_events", c.Found)
}

func TestQueue(t *testing.T) {
	n := func(i int) *int { return &i }
	assertStatus(t, doctor.Queue(doctor.QueueFacts{Queue: "q", Main: n(1), Retry: n(0), Parked: n(0)}, "q.retry", "q.dlq"), doctor.OK, "")
	c := doctor.Queue(doctor.QueueFacts{Queue: "q", Main: n(0), Retry: n(0), Parked: n(2)}, "q.retry", "q.dlq")
	assertStatus(t, c, doctor.Warn, "extworker inbox replay --queue q")
	c = doctor.Queue(doctor.QueueFacts{Queue: "q", Main: n(0)}, "q.retry", "q.dlq")
	assertStatus(t, c, doctor.Fail, "start the worker that consumes q")
	assert.Equal(t, "absent: q.retry, q.dlq", c.Found)
}

func TestAddress(t *testing.T) {
	assertStatus(t, doctor.Address("EXTWORKER_HTTP_ADDR", "127.0.0.1:9464", nil), doctor.OK, "")
	c := doctor.Address("EXTWORKER_HTTP_ADDR", "127.0.0.1:9464", errors.New("address already in use"))
	assertStatus(t, c, doctor.Fail, "set EXTWORKER_HTTP_ADDR to a free address")
}

func TestConfiguration(t *testing.T) {
	assertStatus(t, doctor.Configuration(nil), doctor.OK, "")
	assertStatus(t, doctor.Configuration(errors.New("EXTWORKER_LOCK_DURATION")), doctor.Fail, "extworker config")
}

// TestWrite: one line per check, the fix indented under each that is not ok, the counts
// last; plain words, or symbols for a terminal. The exit code follows the failures.
func TestWrite(t *testing.T) {
	checks := []doctor.Check{
		doctor.Configuration(nil),
		doctor.Address("EXTWORKER_HTTP_ADDR", "127.0.0.1:9464", errors.New("address already in use")),
		doctor.ClockSkew(nil, ptr(3*time.Second)),
		doctor.ClockSkew(nil, nil),
	}
	var plain bytes.Buffer
	require.NoError(t, doctor.Write(&plain, checks, false))
	lines := strings.Split(strings.TrimSuffix(plain.String(), "\n"), "\n")
	require.Len(t, lines, 7)
	assert.Regexp(t, `^OK    configuration +EXTWORKER_`, lines[0])
	assert.Regexp(t, `^FAIL  address EXTWORKER_HTTP_ADDR +127\.0\.0\.1:9464: address already in use$`, lines[1])
	assert.Regexp(t, `^      fix: set EXTWORKER_HTTP_ADDR`, lines[2])
	assert.Regexp(t, `^WARN  clock skew +database \+3\.0s`, lines[3])
	assert.Regexp(t, `^      fix: synchronise`, lines[4])
	assert.Regexp(t, `^SKIP  clock skew +skipped: needs engine reachable or database reachable$`, lines[5])
	assert.Equal(t, "4 checks: 1 ok, 1 warning, 1 failed, 1 skipped", lines[6])

	var sym bytes.Buffer
	require.NoError(t, doctor.Write(&sym, checks, true))
	assert.Regexp(t, `^✓  configuration`, sym.String())
	assert.Contains(t, sym.String(), "\n✗  address")
	assert.Contains(t, sym.String(), "\n!  clock skew")

	assert.Equal(t, doctor.ExitFailed, doctor.ExitCode(checks))
	assert.Equal(t, doctor.ExitOK, doctor.ExitCode(checks[2:]), "warnings and skips do not fail")
	assert.Equal(t, daemon.ExitConfig, doctor.ExitConfig)
}

func TestMigrated(t *testing.T) {
	binary := []int64{1, 2, 3}
	assertStatus(t, doctor.Migrated(doctor.MigrationFacts{Table: true, Applied: binary}, binary), doctor.OK, "")
	c := doctor.Migrated(doctor.MigrationFacts{}, binary)
	assertStatus(t, c, doctor.Fail, "run `extworker migrate`")
	assert.Contains(t, c.Found, "no table")
	behind := fmt.Errorf("%w (database at version 1, this binary needs 3)", migrations.ErrNotMigrated)
	c = doctor.Migrated(doctor.MigrationFacts{Table: true, Applied: []int64{1}, Err: behind}, binary)
	assertStatus(t, c, doctor.Fail, "run `extworker migrate`")
	assert.Equal(t, "behind by 2 migrations (database at version 1, this binary needs 3; missing 2, 3)", c.Found)

	for _, tc := range []struct {
		err     error
		fixHas  string
		because string
	}{
		{&pgconn.PgError{Code: "42501", Message: "permission denied for table extworker_schema_migrations"}, "the login may not read the ledger", "permission"},
		{&pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}, "statement_timeout", "statement timeout"},
		{fmt.Errorf("migrations: %w", context.DeadlineExceeded), "did not answer in time", "deadline"},
	} {
		c := doctor.Migrated(doctor.MigrationFacts{Table: true, Err: tc.err}, binary)
		assertStatus(t, c, doctor.Fail, tc.fixHas)
		assert.NotContains(t, c.Fix, "run `extworker migrate`", tc.because)
	}
}

// A queue name AMQP cannot carry is refused, not reported absent.
func TestValidQueue(t *testing.T) {
	require.NoError(t, doctor.ValidQueue("orders"))
	require.NoError(t, doctor.ValidQueue(strings.Repeat("q", doctor.MaxQueueName-len(".retry")))) // its .retry fits
	err := doctor.ValidQueue(strings.Repeat("q", 256))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "over AMQP's limit of 255")
	require.Error(t, doctor.ValidQueue(""))
}

// A long name (a long queue's) takes a line of its own: the other lines keep their column.
func TestWriteLongName(t *testing.T) {
	long := doctor.NameQueue(strings.Repeat("q", 60))
	var b bytes.Buffer
	require.NoError(t, doctor.Write(&b, []doctor.Check{
		{Name: doctor.NameEngineReachable, Status: doctor.OK, Found: "answers"},
		{Name: long, Status: doctor.OK, Found: "0 ready"},
		{Name: doctor.NameAMQP, Status: doctor.OK, Found: "answers"},
	}, false))
	lines := strings.Split(b.String(), "\n")
	assert.Equal(t, "OK    engine reachable  answers", lines[0])
	assert.Equal(t, "OK    "+long, lines[1])
	assert.Equal(t, "                        0 ready", lines[2])
	assert.Equal(t, "OK    broker reachable  answers", lines[3])
}

// A queue the broker refuses to declare for another reason than absence (access
// refused) is not "absent: start the worker".
func TestQueueRefused(t *testing.T) {
	refused := &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - access to queue 'orders' in vhost 'extworker' refused"}
	c := doctor.Queue(doctor.QueueFacts{Queue: "orders", Err: refused}, "orders.retry", "orders.dlq")
	assertStatus(t, c, doctor.Fail, "rabbitmqctl list_permissions")
	assert.Contains(t, c.Found, "ACCESS_REFUSED")
	assert.NotContains(t, c.Fix, "start the worker")
}

// A database that answers but whose clock could not be read is a warning, not ok.
func TestDatabaseClockUnknown(t *testing.T) {
	c := doctor.Clock(doctor.ClockFacts{Engine: ptr(0), DatabaseUnknown: "SELECT clock_timestamp(): canceling statement due to statement timeout"})
	assertStatus(t, c, doctor.Warn, "date -u")
	assert.Contains(t, c.Found, "database unknown (SELECT clock_timestamp(): canceling statement")
}
