package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// An invalid configuration fails at start with every problem listed at once.
func TestConfigListsEveryProblem(t *testing.T) {
	t.Setenv("EXTWORKER_LOG_FORMAT", "yaml")
	t.Setenv("EXTWORKER_LOG_LEVEL", "loud")
	t.Setenv("EXTWORKER_MAX_CONCURRENCY", "0")
	t.Setenv("EXTWORKER_ENGINE_CERT_FILE", "/tmp/cert.pem")
	t.Setenv("EXTWORKER_LONG_POLL", "31m")
	err := run([]string{"run"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	for _, want := range []string{"EXTWORKER_LOG_FORMAT", "EXTWORKER_LOG_LEVEL", "EXTWORKER_MAX_CONCURRENCY", "EXTWORKER_ENGINE_CERT_FILE", "EXTWORKER_LONG_POLL"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestConfigRejectsMalformedValues(t *testing.T) {
	t.Setenv("EXTWORKER_MAX_CONCURRENCY", "many")
	err := run([]string{"run"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "MAX_CONCURRENCY")
}

// The demo's provider settings are the demo's own: their problems are configuration
// errors (exit 78) of the demo, and the framework's configuration does not check a lease
// against a provider timeout (the ledger's Do does, against the effect's own).
func TestDemoProviderSettings(t *testing.T) {
	t.Setenv("EXTWORKER_PROVIDER_TIMEOUT", "0s")
	t.Setenv("EXTWORKER_PROVIDER_SEARCH_LAG", "-1s")
	err := run([]string{"run"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	assert.True(t, extworker.IsConfigError(err), "%v", err)
	assert.Contains(t, err.Error(), "EXTWORKER_PROVIDER_TIMEOUT 0s: must be positive")
	assert.Contains(t, err.Error(), "EXTWORKER_PROVIDER_SEARCH_LAG -1s: must not be negative")

	t.Setenv("EXTWORKER_PROVIDER_TIMEOUT", "1m")
	t.Setenv("EXTWORKER_PROVIDER_SEARCH_LAG", "1m")
	t.Setenv("EXTWORKER_LEDGER_LEASE", "5s")
	var out bytes.Buffer
	require.NoError(t, run([]string{"config"}, &out, &bytes.Buffer{}), "a lease shorter than the demo's timeout is no configuration problem of the framework's")
	assert.Regexp(t, `(?m)^EXTWORKER_PROVIDER_TIMEOUT\s+1m0s\s+env$`, out.String(), "the demo's config prints its own settings beside the framework's")
	var framework bytes.Buffer
	require.NoError(t, extworker.PrintConfig(nil, &framework, &bytes.Buffer{}))
	assert.NotContains(t, framework.String(), "EXTWORKER_PROVIDER_TIMEOUT", "the framework lists no demo setting")
}

// The broker of the demo's events is a setting of the demo's own (EXTWORKER_DEMO_EVENTS):
// its problems are the demo's configuration errors, `invoice config` prints it, and the
// framework's configuration lists no such variable.
func TestDemoEventsConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string // in the error; none: valid
	}{
		{"amqp by default", map[string]string{}, nil},
		{"kafka", map[string]string{"EXTWORKER_DEMO_EVENTS": "kafka", "EXTWORKER_KAFKA_BROKERS": "127.0.0.1:9092", "EXTWORKER_OUTBOX_BROKER": "kafka"}, nil},
		{"kafka, the relay's broker implied", map[string]string{"EXTWORKER_DEMO_EVENTS": "kafka", "EXTWORKER_KAFKA_BROKERS": "127.0.0.1:9092"}, nil},
		{"unknown broker", map[string]string{"EXTWORKER_DEMO_EVENTS": "nats"}, []string{`EXTWORKER_DEMO_EVENTS "nats": want amqp or kafka`}},
		{"kafka without brokers", map[string]string{"EXTWORKER_DEMO_EVENTS": "kafka", "EXTWORKER_OUTBOX_BROKER": "kafka"},
			[]string{"EXTWORKER_DEMO_EVENTS=kafka needs EXTWORKER_KAFKA_BROKERS"}},
		{"kafka, the relay to RabbitMQ", map[string]string{"EXTWORKER_DEMO_EVENTS": "kafka", "EXTWORKER_KAFKA_BROKERS": "127.0.0.1:9092",
			"EXTWORKER_AMQP_URL": "amqp://127.0.0.1:5672/"}, []string{"set EXTWORKER_OUTBOX_BROKER=kafka"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range []string{"EXTWORKER_DEMO_EVENTS", "EXTWORKER_KAFKA_BROKERS", "EXTWORKER_OUTBOX_BROKER", "EXTWORKER_AMQP_URL"} {
				t.Setenv(v, tc.env[v])
			}
			ec, err := loadEventsConfig()
			if len(tc.want) == 0 {
				require.NoError(t, err)
				assert.Equal(t, cmp.Or(tc.env["EXTWORKER_DEMO_EVENTS"], eventsAMQP), ec.Broker)
				return
			}
			require.Error(t, err)
			assert.True(t, extworker.IsConfigError(err), "%v", err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			err = run([]string{"run"}, &bytes.Buffer{}, &bytes.Buffer{})
			assert.True(t, extworker.IsConfigError(err), "invoice run refuses it before it starts: %v", err)
		})
	}
	t.Setenv("EXTWORKER_DEMO_EVENTS", "kafka")
	t.Setenv("EXTWORKER_KAFKA_BROKERS", "127.0.0.1:9092")
	t.Setenv("EXTWORKER_OUTBOX_BROKER", "kafka")
	var out bytes.Buffer
	require.NoError(t, run([]string{"config"}, &out, &bytes.Buffer{}))
	assert.Regexp(t, `(?m)^EXTWORKER_DEMO_EVENTS\s+kafka\s+env$`, out.String(), "the demo's config prints its events' broker")
	var framework bytes.Buffer
	require.NoError(t, extworker.PrintConfig(nil, &framework, &bytes.Buffer{}))
	assert.NotContains(t, framework.String(), "EXTWORKER_DEMO_EVENTS", "the framework lists no demo setting")
}

// With EXTWORKER_DEMO_EVENTS=kafka the demo's invoice.paid events go through Kafka (a
// broker of the test's own): published by the relay to the topic invoice.paid, consumed in
// the group extworker-demo.shipping, one shipping instance per paid invoice, the copy the
// demo sends on purpose suppressed by the inbox; the summary names the broker.
func TestDemoEventsKafka(t *testing.T) {
	testenv.Engine(t)
	testenv.DB(t)
	node := testenv.StartKafka(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_LOG_LEVEL", "warn")
	t.Setenv("EXTWORKER_AMQP_URL", "")
	t.Setenv("EXTWORKER_DEMO_EVENTS", "kafka")
	t.Setenv("EXTWORKER_KAFKA_BROKERS", node.Addr())
	t.Setenv("EXTWORKER_OUTBOX_BROKER", "kafka")
	out, logs := runDemoLogged(t, "-instances", "20")
	assert.Contains(t, out, "demo OK")
	assert.Contains(t, out, "events: 16 invoice.paid published through the outbox to Kafka (0 waiting)")
	assert.Regexp(t, `1 of them sent twice on purpose: 1 duplicates suppressed by the inbox, 0 parked`, out)
	assert.Contains(t, out, "shipping: 16 instances started for 16 paid invoices")
	assert.False(t, strings.Contains(logs, `"level":"ERROR"`), logs)
}

// The demo runs end to end against the real engine and PostgreSQL: invoices paid through
// the effect ledger (a double submission charged once, lost answers reconciled), declined
// on the BPMN error path, and incidents for the ones without an amount.
func TestDemo(t *testing.T) {
	testenv.Engine(t)
	testenv.DB(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_LOG_LEVEL", "warn")
	out, logs := runDemoLogged(t, "-instances", "20")
	assert.Contains(t, out, "demo OK")
	assert.Regexp(t, `paid\s+17\s+17`, out, "16 invoices, one of them submitted twice")
	assert.Contains(t, out, "0 double charges")
	// Exact counts of replays depend on whoever else serves the demo topics meanwhile.
	assert.Regexp(t, `ledger: [1-9]\d* duplicate deliveries completed from the ledger`, out)
	assert.Contains(t, out, "ledger: 16 paid invoices settled, one intent each")
	assert.Regexp(t, `declined\s+2\s+2`, out)
	assert.Regexp(t, `incident\s+2\s+2`, out)
	assert.False(t, strings.Contains(logs, `"level":"ERROR"`), logs)
}

// runDemoLogged runs `invoice demo` with args, its log file in the test's temporary
// directory, and returns its output and its logs; nothing may go to standard error.
func runDemoLogged(t *testing.T, args ...string) (out, logs string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "demo.log")
	var stdout, stderr bytes.Buffer
	err := run(append([]string{"demo", "-logs", path}, args...), &stdout, &stderr)
	data, rerr := os.ReadFile(path)
	require.NoError(t, rerr)
	require.NoError(t, err, "output:\n%s\nlogs:\n%s", stdout.String(), data)
	assert.Empty(t, stderr.String(), "the worker's logs go to the file")
	assert.Equal(t, "invoice demo: the worker's logs go to "+path, strings.SplitN(stdout.String(), "\n", 2)[0], "the first line names the log file")
	return stdout.String(), string(data)
}

// Where the output is no terminal (a pipe, a CI log), the demo prints the path of its log
// file (a new one in the temporary directory), a plain progress line at most every 5
// seconds, and the summary: no log record; the worker's records are in the file.
func TestDemoPlainOutputAndLogFile(t *testing.T) {
	testenv.Engine(t)
	testenv.DB(t)
	testenv.AMQP(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_LOG_LEVEL", "info")
	t.Setenv("EXTWORKER_AMQP_URL", testenv.AMQPURL())
	t.Setenv("EXTWORKER_DEMO_EVENTS", "")
	var out, stderr bytes.Buffer
	start := time.Now()
	err := run([]string{"demo", "-instances", "20"}, &out, &stderr)
	took := time.Since(start)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	path, ok := strings.CutPrefix(lines[0], "invoice demo: the worker's logs go to ")
	require.True(t, ok, "the first line names the log file:\n%s", out.String())
	t.Cleanup(func() { _ = os.Remove(path) })
	require.NoError(t, err, "output:\n%s", out.String())
	assert.Empty(t, stderr.String(), "nothing on standard error")

	assert.Equal(t, os.TempDir(), filepath.Dir(path))
	assert.Regexp(t, `^extworker-demo-\d+\.log$`, filepath.Base(path))
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the logs are the user's own")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	records := strings.Split(strings.TrimSpace(string(data)), "\n")
	assert.GreaterOrEqual(t, len(records), 20, "a record per task handled at least")
	for _, r := range records {
		var rec struct{ Level, Msg string }
		require.NoError(t, json.Unmarshal([]byte(r), &rec), "a JSON log record: %s", r)
		assert.NotEmpty(t, rec.Msg, r)
	}
	assert.Contains(t, string(data), `"msg":"worker started"`)

	var progress, summary []string
	for _, l := range lines[1:] {
		assert.NotContains(t, l, `"level"`, "no log record in the output")
		assert.NotContains(t, l, "\r", "no terminal control in the output")
		if strings.HasPrefix(l, "progress: ") {
			progress = append(progress, l)
		} else {
			summary = append(summary, l)
		}
	}
	assert.LessOrEqual(t, len(progress), int(took/plainEvery)+1, "a progress line at most every %v in %v:\n%s", plainEvery, took, out.String())
	for _, l := range progress {
		assert.Regexp(t, `^progress: +\d+s  \d+/21 instances started, \d+ paid, \d+ declined \(BPMN error\), \d+ in incident; events: \d+ published, \d+ consumed$`, l)
	}
	assert.Len(t, summary, 12, "the summary as before:\n%s", out.String())
	assert.True(t, strings.HasPrefix(summary[0], "engine "), summary[0])
	assert.True(t, strings.HasPrefix(summary[len(summary)-1], "demo OK"), summary[len(summary)-1])
}

// `run` refuses an unmigrated ledger database and says what to run; `migrate` fixes it.
func TestRunRefusesUnmigratedDatabase(t *testing.T) {
	testenv.Engine(t)
	admin := testenv.DB(t)
	ctx := testenv.Context(t, time.Minute)
	schema := "empty_" + testenv.Unique("s")[2:]
	_, err := admin.Exec(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL()+"?search_path="+schema)

	err = run([]string{"run"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "run `extworker migrate`")
	assert.NotContains(t, err.Error(), "extworker:extworker@", "no credentials in the message")

	var out bytes.Buffer
	require.NoError(t, run([]string{"migrate"}, &out, &bytes.Buffer{}))
	assert.Contains(t, out.String(), fmt.Sprintf("applied migrations %v", migrations.Versions()))
	out.Reset()
	require.NoError(t, run([]string{"migrate"}, &out, &bytes.Buffer{}))
	assert.Contains(t, out.String(), "up to date")
}

// `invoice run` with wrong credentials stops at once with what to check (no worker
// retrying fetches forever), exits with EX_CONFIG, and shows no secret.
func TestRunRejectedCredentials(t *testing.T) {
	testenv.AuthEngine(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"wrong password", map[string]string{"EXTWORKER_ENGINE_USER": testenv.AuthEngineUser, "EXTWORKER_ENGINE_PASSWORD": "wrong-s3cret"},
			"rejected the credentials (401): check EXTWORKER_ENGINE_USER and EXTWORKER_ENGINE_PASSWORD"},
		{"unknown user", map[string]string{"EXTWORKER_ENGINE_USER": "nobody", "EXTWORKER_ENGINE_PASSWORD": "wrong-s3cret"},
			"rejected the credentials (401)"},
		{"bearer token where basic is expected", map[string]string{"EXTWORKER_ENGINE_TOKEN": "wrong-s3cret"},
			"rejected the credentials (401): check EXTWORKER_ENGINE_TOKEN"},
		{"no credentials", nil,
			"requires authentication (401): set EXTWORKER_ENGINE_USER and EXTWORKER_ENGINE_PASSWORD, EXTWORKER_ENGINE_TOKEN, or EXTWORKER_ENGINE_OAUTH_"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("EXTWORKER_ENGINE_URL", testenv.AuthEngineURL())
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			start := time.Now()
			err := run([]string{"run"}, &bytes.Buffer{}, &bytes.Buffer{})
			require.Error(t, err)
			assert.Less(t, time.Since(start), 10*time.Second, "no retry loop")
			assert.Contains(t, err.Error(), "engine at "+testenv.AuthEngineURL()+" ")
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "wrong-s3cret")
			assert.ErrorIs(t, err, camunda7.ErrUnauthorized)
			assert.True(t, extworker.IsConfigError(err), "main exits with EX_CONFIG (%d)", extworker.ExitConfig)
		})
	}
}

// The real binary exits 78 (EX_CONFIG) on the three problems, a worker program's `run` (the operator's `extworker config` is
// tested in cmd/extworker).
func TestConfigInvalidVariablesExit78(t *testing.T) {
	bin := buildBinary(t)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EXTWORKER_") {
			env = append(env, kv)
		}
	}
	env = append(env, "EXTWORKER_LOCK_DURATION=abc", "EXTWORKER_READY_TIMEOUT=soon", "EXTWORKER_MAX_CONCURRENCY=0")
	for _, cmdName := range []string{"run"} {
		t.Run(cmdName, func(t *testing.T) {
			cmd := exec.Command(bin, cmdName)
			cmd.Env = env
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "want an exit status, got %v; stderr:\n%s", err, stderr.String())
			assert.Equal(t, extworker.ExitConfig, exit.ExitCode(), stderr.String())
			for _, v := range []string{"EXTWORKER_LOCK_DURATION", "EXTWORKER_READY_TIMEOUT", "EXTWORKER_MAX_CONCURRENCY"} {
				assert.Contains(t, stderr.String(), v)
			}
			if cmdName == "config" {
				assert.Regexp(t, `EXTWORKER_LOCK_DURATION\s+abc\s+env \(invalid\)`, stdout.String())
				assert.Regexp(t, `EXTWORKER_READY_TIMEOUT\s+soon\s+env \(invalid\)`, stdout.String())
			}
		})
	}
}

// A demo that fails says where the worker's logs are, in the error main prints.
func TestDemoFailureNamesTheLogFile(t *testing.T) {
	testenv.DB(t)
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_ENGINE_URL", "http://"+testenv.FreeAddr(t)+"/engine-rest") // nothing listens there
	path := filepath.Join(t.TempDir(), "demo.log")
	var out, stderr bytes.Buffer
	err := run([]string{"demo", "-instances", "1", "-logs", path}, &out, &stderr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "(the worker's logs: "+path+")")
	assert.Equal(t, "invoice demo: the worker's logs go to "+path+"\n", out.String())
	assert.Empty(t, stderr.String())
	assert.FileExists(t, path)
}
