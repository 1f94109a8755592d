package daemon_test

import (
	"bytes"
	"context"
	"encoding/pem"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
)

// problemLines returns the problems of a configuration error, one per line after the
// "configuration: " prefix.
func problemLines(t *testing.T, err error) []string {
	t.Helper()
	require.Error(t, err)
	var ce daemon.ConfigError
	require.ErrorAs(t, err, &ce, "main exits with EX_CONFIG (%d)", daemon.ExitConfig)
	msg, ok := strings.CutPrefix(err.Error(), "configuration: ")
	require.True(t, ok, err.Error())
	return strings.Split(msg, "\n")
}

// Two values that do not parse (one of config's, one of opsConfig's) and one out of range
// are listed together, each naming its variable, and a variable that did not parse is not
// also reported for the zero value it was left with. No secret is shown.
func TestConfigListsEveryInvalidVariable(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_LOCK_DURATION", "abc")
	t.Setenv("EXTWORKER_READY_TIMEOUT", "soon")
	t.Setenv("EXTWORKER_MAX_CONCURRENCY", "0")
	t.Setenv("EXTWORKER_ENGINE_USER", "worker")
	t.Setenv("EXTWORKER_ENGINE_PASSWORD", "pw-s3cret")
	c, err := daemon.LoadConfig()
	err = c.ScrubError(err) // as every command does
	lines := problemLines(t, err)
	assert.ElementsMatch(t, []string{
		`EXTWORKER_LOCK_DURATION "abc": not a duration: a number with a unit, such as 500ms, 20s, 2m or 1h`,
		`EXTWORKER_MAX_CONCURRENCY 0: must be at least 1`,
		`EXTWORKER_READY_TIMEOUT "soon": not a duration: a number with a unit, such as 500ms, 20s, 2m or 1h`,
	}, lines, "the three problems and nothing else")
	assert.NotContains(t, err.Error(), "s3cret")
	assert.NotContains(t, err.Error(), "envconfig")

	t.Setenv("EXTWORKER_MAX_CONCURRENCY", "many")
	t.Setenv("EXTWORKER_PPROF", "yes")
	t.Setenv("EXTWORKER_LEDGER_MAX_CONNS", "99999999999999999999")
	_, err = daemon.LoadConfig()
	lines = problemLines(t, err)
	assert.Contains(t, lines, `EXTWORKER_MAX_CONCURRENCY "many": not a whole number`)
	assert.Contains(t, lines, `EXTWORKER_PPROF "yes": want true or false`)
	assert.Contains(t, lines, `EXTWORKER_LEDGER_MAX_CONNS "99999999999999999999": out of range`)
	assert.Len(t, lines, 5)

	_, err = daemon.LoadOpsConfig()
	lines = problemLines(t, err)
	assert.ElementsMatch(t, []string{
		`EXTWORKER_PPROF "yes": want true or false`,
		`EXTWORKER_READY_TIMEOUT "soon": not a duration: a number with a unit, such as 500ms, 20s, 2m or 1h`,
	}, lines, "loadOpsConfig (run) names each of its own")
}

// The shipped defaults pass every check, and reach tasks.Config as documented.
func TestConfigDefaultsPass(t *testing.T) {
	testenv.ClearConfigEnv(t)
	c, err := daemon.LoadConfig()
	require.NoError(t, err)
	_, err = daemon.LoadOpsConfig()
	require.NoError(t, err)
	assert.Equal(t, 2*time.Minute, c.LedgerLease)
	assert.Equal(t, 30*time.Second, c.EngineTimeout)
	assert.Equal(t, 20*time.Second, c.LongPoll)
	assert.Equal(t, 20*time.Second, c.LockDuration)
	assert.Equal(t, 10, c.LedgerMaxConns)

	w := c.WorkerConfig(discardLogger())
	assert.Equal(t, 5*time.Minute, w.ReportRetryFor)
	assert.Equal(t, time.Second, w.IdlePollInterval)
	assert.Equal(t, 30*time.Second, w.ShutdownGrace)
	assert.Equal(t, 45*time.Second, w.ShutdownTimeout)
	assert.Equal(t, 20*time.Second, w.AsyncResponseTimeout)
	assert.NoError(t, w.WithDefaults().Validate())
}

// The new variables reach tasks.Config; 0 means none there, not tasks' default.
func TestWorkerConfigFromVariables(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_REPORT_RETRY_FOR", "2m")
	t.Setenv("EXTWORKER_IDLE_POLL_INTERVAL", "250ms")
	t.Setenv("EXTWORKER_SHUTDOWN_GRACE", "10s")
	t.Setenv("EXTWORKER_SHUTDOWN_TIMEOUT", "12s")
	c, err := daemon.LoadConfig()
	require.NoError(t, err)
	w := c.WorkerConfig(discardLogger()).WithDefaults()
	assert.Equal(t, 2*time.Minute, w.ReportRetryFor)
	assert.Equal(t, 250*time.Millisecond, w.IdlePollInterval)
	assert.Equal(t, 10*time.Second, w.ShutdownGrace)
	assert.Equal(t, 12*time.Second, w.ShutdownTimeout)
	require.NoError(t, w.Validate())

	t.Setenv("EXTWORKER_LONG_POLL", "0")
	c, err = daemon.LoadConfig()
	require.NoError(t, err)
	assert.Equal(t, tasks.NoLongPoll, c.WorkerConfig(discardLogger()).WithDefaults().AsyncResponseTimeout, "0: no long poll, not the default")
	require.NoError(t, os.Unsetenv("EXTWORKER_LONG_POLL"))

	t.Setenv("EXTWORKER_REPORT_RETRY_FOR", "0")
	t.Setenv("EXTWORKER_IDLE_POLL_INTERVAL", "0s")
	t.Setenv("EXTWORKER_SHUTDOWN_GRACE", "0")
	require.NoError(t, os.Unsetenv("EXTWORKER_SHUTDOWN_TIMEOUT"))
	c, err = daemon.LoadConfig()
	require.NoError(t, err)
	assert.Equal(t, 15*time.Second, c.ShutdownTimeout, "unset: the grace plus 15s")
	w = c.WorkerConfig(discardLogger()).WithDefaults()
	assert.Equal(t, time.Nanosecond, w.ReportRetryFor, "0: no retrying past the minimum attempts")
	assert.Equal(t, time.Nanosecond, w.IdlePollInterval, "0: no pause")
	assert.Equal(t, time.Nanosecond, w.ShutdownGrace, "0: no grace")
	assert.Equal(t, 15*time.Second, w.ShutdownTimeout)
	require.NoError(t, w.Validate())

	// Raising the grace alone keeps the timeout beyond it.
	t.Setenv("EXTWORKER_SHUTDOWN_GRACE", "90s")
	c, err = daemon.LoadConfig()
	require.NoError(t, err)
	assert.Equal(t, 105*time.Second, c.ShutdownTimeout)
}

// Relations between variables that cannot be safe are refused, each problem naming every
// variable involved; the safe side of each boundary, and a long poll at or beyond the lock
// duration, pass.
func TestConfigRefusesUnsafeRelations(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string // substrings of the one problem; none: valid
	}{
		// The lease is checked against each effect's own timeout by the ledger's Do
		// (idempotency.Effect.Timeout), not against a variable only the demo reads.
		{"a short lease beside the demo's long provider timeout", map[string]string{"LEDGER_LEASE": "5s", "PROVIDER_TIMEOUT": "1m"}, nil},
		{"lease under a second", map[string]string{"LEDGER_LEASE": "999ms"}, []string{"EXTWORKER_LEDGER_LEASE 999ms: must be at least 1s"}},
		{"lock under a second", map[string]string{"LOCK_DURATION": "999ms"},
			[]string{"EXTWORKER_LOCK_DURATION 999ms: must be at least 1s"}},
		{"shortest lock", map[string]string{"LOCK_DURATION": "1s"}, nil},
		{"no long poll and no idle pause", map[string]string{"LONG_POLL": "0", "IDLE_POLL_INTERVAL": "10ms"},
			[]string{"EXTWORKER_IDLE_POLL_INTERVAL 10ms with EXTWORKER_LONG_POLL 0: must be at least 100ms"}},
		{"no long poll, paced idle polls", map[string]string{"LONG_POLL": "0"}, nil},
		{"shutdown timeout not beyond the grace", map[string]string{"SHUTDOWN_GRACE": "1m", "SHUTDOWN_TIMEOUT": "1m"},
			[]string{"EXTWORKER_SHUTDOWN_TIMEOUT 1m0s must be longer than EXTWORKER_SHUTDOWN_GRACE 1m0s"}},
		{"shutdown timeout beyond the grace", map[string]string{"SHUTDOWN_GRACE": "1m", "SHUTDOWN_TIMEOUT": "61s"}, nil},
		{"negative grace", map[string]string{"SHUTDOWN_GRACE": "-1s"}, []string{"EXTWORKER_SHUTDOWN_GRACE -1s: must not be negative"}},
		{"negative report retry", map[string]string{"REPORT_RETRY_FOR": "-1s"}, []string{"EXTWORKER_REPORT_RETRY_FOR -1s: must not be negative"}},
		{"no report retry", map[string]string{"REPORT_RETRY_FOR": "0"}, nil},
		{"negative idle poll interval", map[string]string{"IDLE_POLL_INTERVAL": "-1ms"}, []string{"EXTWORKER_IDLE_POLL_INTERVAL -1ms: must not be negative"}},
		{"no idle poll interval", map[string]string{"IDLE_POLL_INTERVAL": "0"}, nil},
		{"no ledger connections", map[string]string{"LEDGER_MAX_CONNS": "0"}, []string{"EXTWORKER_LEDGER_MAX_CONNS 0: must be at least 1"}},
		// Issue 12, defect 4: a retention that prunes intents the provider may still hold
		// keys for (EXTWORKER_LEDGER_RETENTION=1h was accepted).
		{"retention of an hour", map[string]string{"LEDGER_RETENTION": "1h"},
			[]string{"EXTWORKER_LEDGER_RETENTION 1h0m0s: must be 0 (keep everything) or at least EXTWORKER_PROVIDER_WINDOW 24h0m0s plus 24h0m0s, 48h0m0s"}},
		{"retention within a long provider window", map[string]string{"LEDGER_RETENTION": "72h", "PROVIDER_WINDOW": "60h"},
			[]string{"EXTWORKER_LEDGER_RETENTION 72h0m0s: must be 0 (keep everything) or at least EXTWORKER_PROVIDER_WINDOW 60h0m0s plus 24h0m0s"}},
		{"shortest retention", map[string]string{"LEDGER_RETENTION": "48h"}, nil},
		{"no pruning", map[string]string{"LEDGER_RETENTION": "0"}, nil},
		{"negative approval threshold", map[string]string{"APPROVAL_THRESHOLD": "-1"}, []string{"EXTWORKER_APPROVAL_THRESHOLD -1: must not be negative"}},
		{"approval threshold", map[string]string{"APPROVAL_THRESHOLD": "10000"}, nil},
		{"amqp in clear to a remote broker", map[string]string{"AMQP_URL": "amqp://u:p-s3cret@mq.example.com/v"},
			[]string{"EXTWORKER_AMQP_URL amqp://***@mq.example.com/v: amqp:// sends the password and the events in clear", "EXTWORKER_AMQP_ALLOW_PLAINTEXT=true"}},
		{"amqp in clear, allowed", map[string]string{"AMQP_URL": "amqp://u:p@mq.example.com/v", "AMQP_ALLOW_PLAINTEXT": "true"}, nil},
		{"amqp to loopback", map[string]string{"AMQP_URL": "amqp://u:p@127.0.0.1:5672/v"}, nil},
		{"amqps", map[string]string{"AMQP_URL": "amqps://u:p@mq.example.com/v"}, nil},
		{"not an amqp url", map[string]string{"AMQP_URL": "http://mq.example.com"}, []string{`EXTWORKER_AMQP_URL http://mq.example.com: scheme "http": want amqps (or amqp)`}},
		{"kafka to loopback", map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092,localhost:9093"}, nil},
		{"kafka in clear to a remote broker", map[string]string{"KAFKA_BROKERS": "kafka.example.com:9092"},
			[]string{`EXTWORKER_KAFKA_BROKERS "kafka.example.com:9092": events would travel in clear`, "EXTWORKER_KAFKA_TLS=true"}},
		{"kafka with TLS", map[string]string{"KAFKA_BROKERS": "kafka.example.com:9093", "KAFKA_TLS": "true"}, nil},
		{"kafka broker without a port", map[string]string{"KAFKA_BROKERS": "127.0.0.1"}, []string{`EXTWORKER_KAFKA_BROKERS "127.0.0.1": want host:port`}},
		{"kafka port out of range", map[string]string{"KAFKA_BROKERS": "127.0.0.1:99999"}, []string{`EXTWORKER_KAFKA_BROKERS "127.0.0.1:99999": want host:port, the port 1 to 65535`}},
		{"kafka brokers with spaces", map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092, localhost:9093"}, nil},
		{"callback tolerance of ten years", map[string]string{"CALLBACK_ADDR": "127.0.0.1:8090", "CALLBACK_TOLERANCE": "87600h"},
			[]string{"EXTWORKER_CALLBACK_TOLERANCE 87600h0m0s"}},
		{"kafka session too short", map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "KAFKA_SESSION_TIMEOUT": "1s"},
			[]string{"EXTWORKER_KAFKA_SESSION_TIMEOUT 1s: want 6s"}},
		{"outbox to kafka without brokers", map[string]string{"OUTBOX_BROKER": "kafka"}, []string{"EXTWORKER_OUTBOX_BROKER=kafka needs EXTWORKER_KAFKA_BROKERS"}},
		{"outbox to somewhere else", map[string]string{"OUTBOX_BROKER": "sqs"}, []string{`EXTWORKER_OUTBOX_BROKER "sqs": want amqp or kafka`}},
		{"callbacks on a bad address", map[string]string{"CALLBACK_ADDR": "8090"}, []string{`EXTWORKER_CALLBACK_ADDR "8090": want host:port`}},
		{"long poll longer than the lock", map[string]string{"LONG_POLL": "1m", "LOCK_DURATION": "20s"}, nil},
		{"engine timeout shorter than the long poll", map[string]string{"ENGINE_TIMEOUT": "5s", "LONG_POLL": "20s"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.ClearConfigEnv(t)
			for k, v := range tc.env {
				t.Setenv("EXTWORKER_"+k, v)
			}
			c, err := daemon.LoadConfig()
			if tc.want == nil {
				require.NoError(t, err)
				require.NoError(t, c.WorkerConfig(discardLogger()).WithDefaults().Validate())
				return
			}
			lines := problemLines(t, err)
			require.Len(t, lines, 1, "one problem: %q", lines)
			for _, w := range tc.want {
				assert.Contains(t, lines[0], w)
			}
		})
	}
}

// A variable that did not parse is reported as such, once: no relation involving it is
// checked against the zero it was left with.
func TestConfigUnparsedSkipsRelations(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_LEDGER_LEASE", "two minutes")
	t.Setenv("EXTWORKER_SHUTDOWN_GRACE", "1 minute")
	_, err := daemon.LoadConfig()
	lines := problemLines(t, err)
	assert.ElementsMatch(t, []string{
		`EXTWORKER_LEDGER_LEASE "two minutes": not a duration: a number with a unit, such as 500ms, 20s, 2m or 1h`,
		`EXTWORKER_SHUTDOWN_GRACE "1 minute": not a duration: a number with a unit, such as 500ms, 20s, 2m or 1h`,
	}, lines)
}

// Only EXTWORKER_-prefixed names configure the worker: another program's DATABASE_URL or
// LOCK_DURATION is not read (envconfig.Process with a prefix would fall back to them).
func TestConfigIgnoresUnprefixedVariables(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("LOCK_DURATION", "abc")
	t.Setenv("DATABASE_URL", "postgres://other:secret@elsewhere/other")
	t.Setenv("READY_TIMEOUT", "soon")
	c, err := daemon.LoadConfig()
	require.NoError(t, err)
	assert.Equal(t, 20*time.Second, c.LockDuration)
	assert.Equal(t, "postgres://extworker:extworker@127.0.0.1:5432/extworker", c.DatabaseURL)
}

// The ledger's pool is capped by EXTWORKER_LEDGER_MAX_CONNS whatever the concurrency;
// pool_max_conns in the URL wins.
func TestLedgerPoolCap(t *testing.T) {
	c := daemon.Config{DatabaseURL: "postgres://u:p@db/x", MaxConcurrency: 200, LedgerMaxConns: 10}
	pc, err := daemon.LedgerPoolConfig(c)
	require.NoError(t, err)
	assert.EqualValues(t, 10, pc.MaxConns)

	c.LedgerMaxConns = 3
	pc, err = daemon.LedgerPoolConfig(c)
	require.NoError(t, err)
	assert.EqualValues(t, 3, pc.MaxConns)

	c.DatabaseURL = "postgres://u:p@db/x?pool_max_conns=7"
	pc, err = daemon.LedgerPoolConfig(c)
	require.NoError(t, err)
	assert.EqualValues(t, 7, pc.MaxConns)

	c.DatabaseURL = "host=db user=u pool_max_conns=5"
	pc, err = daemon.LedgerPoolConfig(c)
	require.NoError(t, err)
	assert.EqualValues(t, 5, pc.MaxConns)
}

// assertVerified checks that pgx tries every host of pc over TLS that verifies the server
// against its name, and never in plaintext.
func assertVerified(t *testing.T, pc *pgxpool.Config, dsn string) {
	t.Helper()
	hosts := daemon.DatabaseHosts(pc.ConnConfig.Config)
	for _, h := range hosts {
		if assert.NotNil(t, h.TLSConfig, "%s: host %s without TLS", dsn, h.Host) {
			assert.False(t, h.TLSConfig.InsecureSkipVerify, "%s: host %s", dsn, h.Host)
			assert.Nil(t, h.TLSConfig.VerifyPeerCertificate, dsn)
			assert.Equal(t, h.Host, h.TLSConfig.ServerName, dsn)
		}
	}
	assert.Empty(t, daemon.DatabaseTLSWarning(dsn, pc), dsn)
}

// EXTWORKER_DATABASE_URL without sslmode to a host that is not loopback is verified TLS
// (sslmode=verify-full), not pgx's default prefer, which falls back to plaintext and
// verifies nothing: for the ledger's pool, migrate's and the readiness checks'.
func TestDatabaseTLSVerifiedByDefault(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	_, _, cert := writeClientCert(t, t.TempDir())
	ca := testenv.WriteFile(t, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})))
	for _, dsn := range []string{
		"postgres://u:db-s3cret@db.example.com/x",
		"postgresql://u:db-s3cret@db.example.com:5433/x?application_name=worker&pool_max_conns=4",
		"postgres://u:db-s3cret@10.1.2.3/x",
		"postgres://u:db-s3cret@[2001:db8::1]:5432/x",
		"postgres://u:db-s3cret@127.0.0.1:5432,db.example.com:5432/x",
		"postgres://u:db-s3cret@db.example.com/x?sslrootcert=" + ca,
		"host=db.example.com user=u password=db-s3cret dbname=x",
	} {
		pc, err := daemon.LedgerPoolConfig(daemon.Config{DatabaseURL: dsn, LedgerMaxConns: 10})
		require.NoError(t, err, dsn)
		assertVerified(t, pc, dsn)
		pc, err = daemon.DatabaseConfig(dsn) // migrate and openOpsPool
		require.NoError(t, err, dsn)
		assertVerified(t, pc, dsn)
		require.NoError(t, daemon.CheckDatabaseURL(dsn), dsn)
		if strings.Contains(dsn, "sslrootcert") {
			assert.NotNil(t, pc.ConnConfig.TLSConfig.RootCAs, "sslrootcert is kept")
		}
	}
	pc, err := daemon.LedgerPoolConfig(daemon.Config{DatabaseURL: "postgresql://u:p@db.example.com:5433/x?pool_max_conns=4", LedgerMaxConns: 10})
	require.NoError(t, err)
	assert.EqualValues(t, 4, pc.MaxConns, "the URL's other parameters still apply")
	assert.Equal(t, uint16(5433), pc.ConnConfig.Port)
}

// Loopback hosts and unix sockets keep pgx's default (the local test database has no TLS).
func TestDatabaseTLSLoopbackKeepsDefault(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	for _, dsn := range []string{
		"postgres://extworker:extworker@127.0.0.1:5432/extworker",
		"postgres://u:p@localhost/x",
		"postgres://u:p@[::1]:5432/x",
		"postgres://u:p@127.0.0.1,localhost/x",
		"host=/var/run/postgresql user=u dbname=x",
	} {
		want, err := pgxpool.ParseConfig(dsn)
		require.NoError(t, err)
		got, err := daemon.DatabaseConfig(dsn)
		require.NoError(t, err, dsn)
		wantHosts, gotHosts := daemon.DatabaseHosts(want.ConnConfig.Config), daemon.DatabaseHosts(got.ConnConfig.Config)
		require.Len(t, gotHosts, len(wantHosts), dsn)
		for i := range wantHosts {
			assert.Equal(t, wantHosts[i].TLSConfig == nil, gotHosts[i].TLSConfig == nil, dsn)
			if wantHosts[i].TLSConfig != nil {
				assert.Equal(t, wantHosts[i].TLSConfig.InsecureSkipVerify, gotHosts[i].TLSConfig.InsecureSkipVerify, dsn)
			}
		}
		assert.Empty(t, daemon.DatabaseTLSWarning(dsn, got), dsn)
	}
}

// An explicit sslmode (or PGSSLMODE) is honoured; one that skips verification to a host
// that is not loopback is warned of, naming the mode and the host, never the password.
func TestDatabaseTLSExplicitModeHonouredAndWarned(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	for _, tc := range []struct {
		mode      string
		plaintext bool   // a host is tried without TLS
		warn      string // "" none
	}{
		{"disable", true, "sslmode=disable lets the connection to the ledger database at db.example.com go without TLS"},
		{"allow", true, "sslmode=allow lets the connection to the ledger database at db.example.com go without TLS"},
		{"prefer", true, "sslmode=prefer lets the connection to the ledger database at db.example.com go without TLS"},
		{"require", false, "sslmode=require encrypts the connection to the ledger database at db.example.com but does not verify the server's certificate"},
		{"verify-ca", false, ""},
		{"verify-full", false, ""},
	} {
		dsn := "postgres://u:db-s3cret@db.example.com/x?sslmode=" + tc.mode
		pc, err := daemon.LedgerPoolConfig(daemon.Config{DatabaseURL: dsn})
		require.NoError(t, err, dsn)
		plain := false
		for _, h := range daemon.DatabaseHosts(pc.ConnConfig.Config) {
			plain = plain || h.TLSConfig == nil
		}
		assert.Equal(t, tc.plaintext, plain, dsn)
		w := daemon.DatabaseTLSWarning(dsn, pc)
		assert.NotContains(t, w, "s3cret")
		if tc.warn == "" {
			assert.Empty(t, w, dsn)
			continue
		}
		assert.Contains(t, w, tc.warn)
		assert.Contains(t, w, "use sslmode=verify-full")

		loopback := "postgres://u:p@127.0.0.1:5432/x?sslmode=" + tc.mode
		pc, err = daemon.DatabaseConfig(loopback)
		require.NoError(t, err)
		assert.Empty(t, daemon.DatabaseTLSWarning(loopback, pc), "no warning for loopback")
	}

	dsn := "postgres://u:db-s3cret@db.example.com/x?sslmode=disable"
	pc, err := daemon.LedgerPoolConfig(daemon.Config{DatabaseURL: dsn})
	require.NoError(t, err)
	assert.Nil(t, pc.ConnConfig.TLSConfig, "sslmode=disable is honoured")
	assert.Empty(t, pc.ConnConfig.Fallbacks)

	// PGSSLMODE chooses too (pgx reads it), and is honoured like sslmode.
	t.Setenv("PGSSLMODE", "require")
	dsn = "postgres://u:db-s3cret@db.example.com/x"
	pc, err = daemon.DatabaseConfig(dsn)
	require.NoError(t, err)
	require.NotNil(t, pc.ConnConfig.TLSConfig)
	assert.True(t, pc.ConnConfig.TLSConfig.InsecureSkipVerify)
	assert.Contains(t, daemon.DatabaseTLSWarning(dsn, pc), "EXTWORKER_DATABASE_URL: PGSSLMODE=require encrypts the connection to the ledger database at db.example.com")
}

// openLedger logs the warning once, before connecting.
func TestDatabaseTLSWarningLoggedAtStart(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	// TEST-NET-1: nothing answers; the connection fails after the warning.
	c := daemon.Config{DatabaseURL: "postgres://u:db-s3cret@192.0.2.1:1/x?sslmode=require&connect_timeout=1", LedgerMaxConns: 1}
	_, _, err := daemon.OpenLedger(ctx, c, logger, true)
	require.Error(t, err)
	assert.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), logs.String())
	assert.Contains(t, logs.String(), "sslmode=require encrypts the connection to the ledger database at 192.0.2.1 but does not verify")
	assert.NotContains(t, logs.String(), "s3cret")
}
func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// EXTWORKER_LOCK_WATCH: unset, the worker derives the watch's period; 0 turns it off; a
// duration sets it; a negative one is refused with its name.
func TestConfigLockWatch(t *testing.T) {
	c, err := daemon.LoadConfig()
	require.NoError(t, err)
	assert.Equal(t, time.Duration(0), c.WorkerConfig(nil).LockWatch, "unset: derived by the worker")
	t.Setenv("EXTWORKER_LOCK_WATCH", "0")
	c, err = daemon.LoadConfig()
	require.NoError(t, err)
	assert.Negative(t, c.WorkerConfig(nil).LockWatch, "0: off")
	t.Setenv("EXTWORKER_LOCK_WATCH", "5s")
	c, err = daemon.LoadConfig()
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, c.WorkerConfig(nil).LockWatch)
	t.Setenv("EXTWORKER_LOCK_WATCH", "-1s")
	_, err = daemon.LoadConfig()
	require.ErrorContains(t, err, "EXTWORKER_LOCK_WATCH -1s: must be at least 1s")
	t.Setenv("EXTWORKER_LOCK_WATCH", "1ms")
	_, err = daemon.LoadConfig()
	require.ErrorContains(t, err, "EXTWORKER_LOCK_WATCH 1ms: must be at least 1s", "a watch every millisecond would be a busy loop of queries")
}

// Each of the ledger database's hosts is given 5 s to connect unless the URL (or
// PGCONNECT_TIMEOUT) says otherwise: a silent first host of a primary/standby URL must
// not hold every connection attempt until the statement's deadline.
func TestDatabaseConfigConnectTimeout(t *testing.T) {
	t.Setenv("PGCONNECT_TIMEOUT", "")
	pc, err := daemon.DatabaseConfig("postgres://u@127.0.0.1:5437,127.0.0.1:5438/ledger?target_session_attrs=read-write")
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, pc.ConnConfig.ConnectTimeout)
	pc, err = daemon.DatabaseConfig("postgres://u@127.0.0.1/ledger?connect_timeout=2")
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, pc.ConnConfig.ConnectTimeout, "the URL's own")
	t.Setenv("PGCONNECT_TIMEOUT", "7")
	pc, err = daemon.DatabaseConfig("postgres://u@127.0.0.1/ledger")
	require.NoError(t, err)
	assert.Equal(t, 7*time.Second, pc.ConnConfig.ConnectTimeout, "PGCONNECT_TIMEOUT's")
}
