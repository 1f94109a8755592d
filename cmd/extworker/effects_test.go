package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/termsafe"
	"github.com/extworker/extworker/internal/testenv"
)

// effectsEnv points the command at the test database and engine, in a namespace of its
// own so that no other test's intents show up, and returns a ledger on that namespace
// to create intents with.
func effectsEnv(t *testing.T) *idempotency.Ledger {
	t.Helper()
	ns := testenv.Unique("ns")
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_LEDGER_NAMESPACE", ns)
	t.Setenv("EXTWORKER_LOG_LEVEL", "warn")
	pool := testenv.DB(t) // skips (or fails in CI) without a database
	var out, errOut bytes.Buffer
	require.NoError(t, run([]string{"migrate"}, &out, &errOut), "migrate: %s %s", out.String(), errOut.String())
	testenv.RegisterOperators(t, pool)
	t.Cleanup(func() {
		// The test's intents and resolutions go with it (events are append-only, and stay).
		for _, table := range []string{"extworker_intents", "extworker_resolutions", "extworker_intent_tombstones"} {
			if _, err := pool.Exec(context.Background(), `DELETE FROM `+table+` WHERE namespace = $1`, ns); err != nil {
				t.Logf("cleanup: delete namespace %s from %s: %v", ns, table, err)
			}
		}
	})
	l, err := idempotency.New(pool, idempotency.Config{Namespace: ns})
	require.NoError(t, err)
	return l
}

// effects runs `extworker effects args...` and returns its standard output.
func effects(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(append([]string{"effects"}, args...), &out, &errOut)
	return out.String(), err
}

// effectsAs runs `extworker effects args...` as one of the operator logins make up
// creates (testenv.AliceLogin, testenv.BobLogin): each operator has a database user of
// their own.
func effectsAs(t *testing.T, login string, args ...string) (string, error) {
	t.Helper()
	testenv.DBAs(t, login) // fails in CI, skips elsewhere, without the login
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURLAs(login))
	defer t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	return effects(t, args...)
}

// mustEffectsAs is effectsAs that must succeed.
func mustEffectsAs(t *testing.T, login string, args ...string) string {
	t.Helper()
	out, err := effectsAs(t, login, args...)
	require.NoError(t, err, "effects %q as %s; output:\n%s", args, login, out)
	return out
}

// pendingID returns the resolution number resolve printed.
func pendingID(t *testing.T, out string) string {
	t.Helper()
	m := regexp.MustCompile(`resolution #(\d+) of `).FindStringSubmatch(out)
	require.NotNil(t, m, "no pending resolution in:\n%s", out)
	return m[1]
}

// mustEffects is effects that must succeed.
func mustEffects(t *testing.T, args ...string) string {
	t.Helper()
	out, err := effects(t, args...)
	require.NoError(t, err, "effects %q; output:\n%s", args, out)
	return out
}

type order struct {
	ID string `json:"id"`
}

// confirmIntent records an intent confirmed by the provider with reference "ref-KEY".
func confirmIntent(t *testing.T, l *idempotency.Ledger, scope, key string) {
	t.Helper()
	out, err := l.Do(testenv.Context(t, time.Minute), idempotency.Intent{Scope: scope, Key: key, Request: order{key},
		Task: idempotency.TaskRef{Actor: "test-worker"}},
		idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
			return idempotency.Result{ProviderRef: "ref-" + key, Values: map[string]any{"ref": "ref-" + key}}, nil
		}})
	require.NoError(t, err)
	require.Equal(t, idempotency.StateConfirmed, out.State)
}

// holdIntent records an intent whose dispatch had an ambiguous outcome and that has no
// Reconcile: the first attempt leaves it unknown, the second puts it on operator hold.
func holdIntent(t *testing.T, l *idempotency.Ledger, scope, key string, task idempotency.TaskRef) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	in := idempotency.Intent{Scope: scope, Key: key, Request: order{key}, Task: task}
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		return idempotency.Result{}, errors.New("read timeout after the request was sent")
	}}
	_, err := l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	_, err = l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	require.Equal(t, failure.KindUnknownOutcome, failure.Classify(err).Kind)
	r, err := l.Operations().Get(ctx, scope, key)
	require.NoError(t, err)
	require.Equal(t, idempotency.StateOperatorHold, r.State)
}

// noDispatch is an effect whose provider must not be called.
func noDispatch(t *testing.T) idempotency.Effect {
	return idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		t.Error("the provider was called for an intent the ledger has settled")
		return idempotency.Result{}, errors.New("must not be called")
	}}
}

func TestEffectsUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"frobnicate"}} {
		_, err := effects(t, args...)
		require.Error(t, err)
		for _, cmd := range []string{`list\s+\[--state`, `show\s+KEY`, `resolve\s+KEY --as`, `resolutions\s+\[--status`, `approve\s+ID`,
			`reject\s+ID`, `prune\s+--older-than`} {
			assert.Regexp(t, `(?m)^\s+`+cmd, err.Error())
		}
	}
	_, err := effects(t, "frobnicate")
	assert.Contains(t, err.Error(), `unknown command "frobnicate"`)
}

func TestEffectsList(t *testing.T) {
	l := effectsEnv(t)
	confirmIntent(t, l, "payment.collect", "invoice:A")
	holdIntent(t, l, "payment.collect", "invoice:B", idempotency.TaskRef{Actor: "w1", TaskID: "task-B"})
	confirmIntent(t, l, "mail.send", "welcome:C")

	out := mustEffects(t, "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	assert.Regexp(t, `^SCOPE\s+KEY\s+STATE\s+ATTEMPT\s+DISPATCHES\s+PROVIDER REF\s+TASK\s+UPDATED$`, lines[0])
	// Most recently changed first.
	assert.Regexp(t, `^mail\.send\s+welcome:C\s+confirmed\s+1\s+1\s+ref-welcome:C\s+-\s+(just now|\d+s ago)$`, lines[1])
	assert.Regexp(t, `^payment\.collect\s+invoice:B\s+operator_hold\s+2\s+1\s+-\s+task-B\s+`, lines[2])
	assert.Regexp(t, `^payment\.collect\s+invoice:A\s+confirmed\s+1\s+1\s+ref-invoice:A\s+-\s+`, lines[3])

	out = mustEffects(t, "list", "--state", "operator_hold")
	assert.Contains(t, out, "invoice:B")
	assert.NotContains(t, out, "invoice:A")
	assert.NotContains(t, out, "welcome:C")

	out = mustEffects(t, "list", "--state", "confirmed,rejected", "--scope", "payment.collect")
	assert.Contains(t, out, "invoice:A")
	assert.NotContains(t, out, "invoice:B")
	assert.NotContains(t, out, "welcome:C")

	out = mustEffects(t, "list", "--older-than", "1h")
	assert.Contains(t, out, "no intents match")

	out = mustEffects(t, "list", "--limit", "1")
	assert.Contains(t, out, "welcome:C")
	assert.NotContains(t, out, "invoice:")

	var got listJSON
	require.NoError(t, json.Unmarshal([]byte(mustEffects(t, "list", "--json")), &got))
	assert.Equal(t, l.Namespace(), got.Namespace)
	require.Len(t, got.Intents, 3)
	assert.Equal(t, "welcome:C", got.Intents[0].Key)
	assert.Equal(t, "operator_hold", got.Intents[1].State)
	require.NotNil(t, got.Intents[1].TaskID)
	assert.Equal(t, "task-B", *got.Intents[1].TaskID)
	require.NotNil(t, got.Intents[2].ProviderRef)
	assert.Equal(t, "ref-invoice:A", *got.Intents[2].ProviderRef)
	assert.JSONEq(t, `{"ref": "ref-invoice:A"}`, string(got.Intents[2].Result))

	for _, bad := range [][]string{{"--state", "held"}, {"--state", "confirmed,bogus"}} {
		_, err := effects(t, append([]string{"list"}, bad...)...)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "valid states are prepared, dispatched, confirmed, rejected, unknown, reconciled, compensated, operator_hold")
	}
	_, err := effects(t, "list", "--limit", "0")
	assert.ErrorContains(t, err, "--limit")
	_, err = effects(t, "list", "--older-than", "soon")
	assert.ErrorContains(t, err, "older-than")
}

func TestEffectsShow(t *testing.T) {
	testenv.Engine(t)
	l := effectsEnv(t)
	gone := testenv.Unique("no-such-task")
	holdIntent(t, l, "payment.collect", "invoice:S", idempotency.TaskRef{Actor: "worker-x", TaskID: gone})

	out := mustEffects(t, "show", "invoice:S")
	for _, want := range []string{
		"payment.collect / invoice:S", l.Namespace(), "operator_hold", "ew_", // the provider key
		"the dispatch outcome is unknown and this effect has neither Reconcile nor Search",
		"events (4):", "(new) -> prepared", "prepared -> dispatched", "dispatched -> unknown", "unknown -> operator_hold",
		"worker-x", "unknown outcome of the dispatch: read timeout",
		"engine: task " + gone + " gone (completed or cancelled)",
	} {
		assert.Contains(t, out, want)
	}
	assert.Regexp(t, `(?m)^state\s+operator_hold$`, out)
	assert.Regexp(t, `(?m)^attempt\s+2$`, out)
	assert.Regexp(t, `(?m)^dispatches\s+1$`, out)

	var got showJSON
	require.NoError(t, json.Unmarshal([]byte(mustEffects(t, "show", "invoice:S", "--json")), &got))
	assert.Equal(t, "operator_hold", got.Intent.State)
	require.Len(t, got.Events, 4)
	assert.Nil(t, got.Events[0].FromState)
	assert.Equal(t, "prepared", got.Events[0].ToState)
	assert.Equal(t, "operator_hold", got.Events[3].ToState)
	assert.Equal(t, "worker-x", got.Events[3].Actor)
	assert.Equal(t, gone, got.Engine.TaskID)
	assert.True(t, got.Engine.TaskGone)
	assert.Empty(t, got.Engine.Error)

	// The same key in a second scope: without --scope the command names both.
	confirmIntent(t, l, "refund.issue", "invoice:S")
	_, err := effects(t, "show", "invoice:S")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "payment.collect")
	assert.Contains(t, err.Error(), "refund.issue")
	assert.Contains(t, err.Error(), "--scope")
	out = mustEffects(t, "show", "--scope", "refund.issue", "invoice:S")
	assert.Regexp(t, `(?m)^state\s+confirmed$`, out)
	assert.Contains(t, out, "ref-invoice:S")
	assert.Contains(t, out, "engine: no task recorded for this intent")

	_, err = effects(t, "show", "invoice:nope")
	assert.ErrorIs(t, err, idempotency.ErrNotFound)
	_, err = effects(t, "show")
	assert.ErrorContains(t, err, "KEY is missing")
}

// An engine that cannot be reached does not hide the ledger, and its credentials are
// not printed.
func TestEffectsShowEngineUnreachable(t *testing.T) {
	l := effectsEnv(t)
	t.Setenv("EXTWORKER_ENGINE_URL", "http://127.0.0.1:1/engine-rest")
	t.Setenv("EXTWORKER_ENGINE_USER", "operator")
	t.Setenv("EXTWORKER_ENGINE_PASSWORD", "hunter2")
	holdIntent(t, l, "payment.collect", "invoice:U", idempotency.TaskRef{Actor: "w", TaskID: "task-U"})
	out := mustEffects(t, "show", "invoice:U")
	assert.Regexp(t, `(?m)^state\s+operator_hold$`, out)
	assert.Contains(t, out, "events (4):")
	assert.Contains(t, out, "engine: unreachable: ")
	assert.NotContains(t, out, "hunter2")

	var got showJSON
	require.NoError(t, json.Unmarshal([]byte(mustEffects(t, "show", "invoice:U", "--json")), &got))
	assert.Equal(t, "operator_hold", got.Intent.State)
	assert.True(t, strings.HasPrefix(got.Engine.Error, "unreachable: "), got.Engine.Error)
	assert.Equal(t, "http://127.0.0.1:1/engine-rest", got.Engine.URL)
}

// Flags the ledger would refuse are refused before anything is opened: the database URL
// here does not even lead anywhere.
func TestEffectsResolveRequiresFlags(t *testing.T) {
	t.Setenv("EXTWORKER_DATABASE_URL", "postgres://nobody:s3cret@127.0.0.1:1/none")
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"K", "--reason", "r", "--operator", "o"}, []string{"--as confirmed|rejected|retry|close is required"}},
		{[]string{"K", "--as", "confirmed", "--provider-ref", "ch_1", "--operator", "o"}, []string{"--reason is required"}},
		{[]string{"K"}, []string{"--as", "--reason"}},
		{[]string{"K", "--as", "maybe", "--reason", "r", "--operator", "o"}, []string{`--as "maybe": must be confirmed, rejected, retry or close`}},
		{[]string{"K", "--as", "close", "--provider-ref", "ch_1", "--reason", "r"}, []string{"--provider-ref and --value go with --as confirmed, not close"}},
		{[]string{"K", "--as", "confirmed", "--provider-ref", "ch_1", "--value", "a=1", "--value", "a=2", "--reason", "r"}, []string{"a is given twice"}},
		{[]string{"K", "--as", "confirmed", "--provider-ref", "ch_1", "--value", "k=x\xff\xfey", "--reason", "r"}, []string{"not valid UTF-8"}},
		{[]string{"K", "--as", "retry", "--provider-ref", "ch_1", "--reason", "r", "--operator", "o"}, []string{"--provider-ref and --value go with --as confirmed"}},
		{[]string{"K", "--as", "confirmed", "--reason", "r", "--operator", "o"}, []string{"--provider-ref is required with --as confirmed"}},
		{[]string{"--as", "rejected", "--reason", "r", "--operator", "o"}, []string{"KEY is missing"}},
		{[]string{"K", "L", "--as", "rejected", "--reason", "r", "--operator", "o"}, []string{"one KEY expected"}},
	}
	for _, c := range cases {
		_, err := effects(t, append([]string{"resolve"}, c.args...)...)
		require.Error(t, err, "%q", c.args)
		for _, w := range c.want {
			assert.Contains(t, err.Error(), w, "%q", c.args)
		}
		assert.NotContains(t, err.Error(), "ledger database", "%q: nothing is opened before the flags are checked", c.args)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"approve", "--reason", "r", "--operator", "o"}, "one resolution ID expected"},
		{[]string{"approve", "x1", "--reason", "r", "--operator", "o"}, `resolution ID "x1": want a number`},
		{[]string{"reject", "7", "--operator", "o"}, "--reason is required"},
		{[]string{"resolutions", "--status", "maybe"}, `--status "maybe": want all, pending, approved, rejected or stale`},
	} {
		_, err := effects(t, c.args...)
		assert.ErrorContains(t, err, c.want, "%q", c.args)
		assert.NotContains(t, err.Error(), "ledger database", "%q: nothing is opened before the flags are checked", c.args)
	}
	_, err := effects(t, "prune")
	assert.ErrorContains(t, err, "--older-than DURATION is required")
	assert.NotContains(t, err.Error(), "ledger database")
	// Past the flags, the database is opened; its password is never printed.
	_, err = effects(t, "list")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ledger database at postgres://***@127.0.0.1:1/none")
	assert.NotContains(t, err.Error(), "s3cret")
	_, err = effects(t, "prune", "--older-than", "-1h")
	assert.ErrorContains(t, err, "must not be negative")
}

func TestEffectsResolveConfirmedReplays(t *testing.T) {
	l := effectsEnv(t)
	ctx := testenv.Context(t, time.Minute)
	holdIntent(t, l, "payment.collect", "invoice:R", idempotency.TaskRef{Actor: "w"})

	// Declaring money moved waits for a second operator (the intent records no amount).
	out := mustEffectsAs(t, testenv.AliceLogin, "resolve", "invoice:R", "--as", "confirmed", "--provider-ref", "ch_manual", "--value", "paymentRef=ch_manual",
		"--reason", "charge found in the provider dashboard", "--operator", "alice")
	id := pendingID(t, out)
	assert.Contains(t, out, `recorded by alice: confirmed (provider ref ch_manual, values {"paymentRef": "ch_manual"}); the intent stays operator_hold until a second operator decides`,
		"the approver sees every value that will be written (issue 23, item 3)")
	assert.Contains(t, out, "extworker effects approve "+id+" --reason TEXT")
	assert.Equal(t, idempotency.StateOperatorHold, mustState(t, l, "payment.collect", "invoice:R"))
	out = mustEffectsAs(t, testenv.AliceLogin, "resolutions", "--status", "pending")
	assert.Regexp(t, `(?m)^`+id+`\s+payment.collect\s+invoice:R\s+confirmed \(provider ref ch_manual, values \{"paymentRef": "ch_manual"\}\)\s+pending\s+alice \(`+testenv.AliceLogin+`\)`, out)
	_, err := effectsAs(t, testenv.AliceLogin, "approve", id, "--operator", "alice", "--reason", "me again")
	assert.ErrorIs(t, err, idempotency.ErrSelfApproval)
	out = mustEffectsAs(t, testenv.BobLogin, "approve", id, "--operator", "bob", "--reason", "saw ch_manual too")
	assert.Contains(t, out, "ledger: payment.collect/invoice:R is now confirmed (provider ref ch_manual), by operator:bob")
	assert.Contains(t, out, "engine: no task recorded for this intent; nothing to do in the engine")

	r, err := l.Operations().Get(ctx, "payment.collect", "invoice:R")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, r.State)
	require.NotNil(t, r.ProviderRef)
	assert.Equal(t, "ch_manual", *r.ProviderRef)
	events, err := l.Operations().Events(ctx, "payment.collect", "invoice:R")
	require.NoError(t, err)
	last := events[len(events)-1]
	assert.Equal(t, "operator:bob", last.Actor)
	assert.Equal(t, testenv.BobLogin, last.DBUser)
	assert.Equal(t, idempotency.StateConfirmed, last.ToState)
	require.NotNil(t, last.FromState)
	assert.Equal(t, "operator_hold", *last.FromState)
	assert.Contains(t, last.Reason, "requested by alice (database user "+testenv.AliceLogin+")")
	assert.Contains(t, last.Reason, "charge found in the provider dashboard")
	assert.Contains(t, last.Reason, "approved by bob (database user "+testenv.BobLogin+"): saw ch_manual too")

	// The task's next attempt completes from the ledger, without the provider.
	o, err := l.Do(ctx, idempotency.Intent{Scope: "payment.collect", Key: "invoice:R", Request: order{"invoice:R"}}, noDispatch(t))
	require.NoError(t, err)
	assert.True(t, o.Replayed)
	assert.Equal(t, "ch_manual", o.ProviderRef)
	assert.Equal(t, map[string]any{"paymentRef": "ch_manual"}, o.Values, "the result values the operator gave")
	assert.Nil(t, r.ErrorMessage, "a confirmed intent carries no error")

	// A settled intent is not resolved again.
	_, err = effectsAs(t, testenv.BobLogin, "resolve", "invoice:R", "--as", "rejected", "--reason", "oops", "--operator", "bob")
	assert.ErrorContains(t, err, "only unknown or held intents are resolved")

	// Rejected, as JSON: the next attempt declines with the operator's code.
	holdIntent(t, l, "payment.collect", "invoice:J", idempotency.TaskRef{Actor: "w"})
	var got resolveJSON
	require.NoError(t, json.Unmarshal([]byte(mustEffectsAs(t, testenv.BobLogin, "resolve", "invoice:J", "--as", "rejected", "--error-code", "CARD_DECLINED",
		"--reason", "declined per provider support", "--operator", "bob", "--json")), &got))
	assert.Equal(t, "rejected", got.Intent.State)
	require.NotNil(t, got.Intent.ErrorCode)
	assert.Equal(t, "CARD_DECLINED", *got.Intent.ErrorCode)
	require.NotNil(t, got.Engine, "a rejection is one operator's call: applied at once")
	assert.Equal(t, "no_task", got.Engine.Action)
	_, err = l.Do(ctx, idempotency.Intent{Scope: "payment.collect", Key: "invoice:J", Request: order{"invoice:J"}}, noDispatch(t))
	oc := failure.Classify(err)
	assert.Equal(t, failure.KindBPMNError, oc.Kind)
	assert.Equal(t, "CARD_DECLINED", oc.Code)
}

// The full loop against the real engine: a held payment's task is at 0 retries with an
// incident; resolving gives it a retry, the incident goes, and the next attempt
// completes the task from the ledger.
func TestEffectsResolveGivesTheTaskItsRetryBack(t *testing.T) {
	c := testenv.Engine(t)
	l := effectsEnv(t)
	ctx := testenv.Context(t, 2*time.Minute)
	m := testenv.Deploy(t, c, testenv.ModelOptions{NoMessageWait: true})
	pi, err := c.StartProcess(ctx, m.Key, admin.StartProcessRequest{BusinessKey: "INV-E"})
	require.NoError(t, err)
	worker := testenv.Unique("w")
	fetch := func() camunda7.LockedExternalTask {
		t.Helper()
		tasks, err := c.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: worker, MaxTasks: 1, AsyncResponseTimeout: 10 * time.Second,
			Topics: []camunda7.FetchTopic{{TopicName: m.Topic, LockDuration: time.Minute}}})
		require.NoError(t, err)
		require.Len(t, tasks, 1)
		return tasks[0]
	}
	task := fetch()
	ref := idempotency.TaskRef{Actor: worker, TaskID: task.ID, ProcessInstanceID: pi.ID, BusinessKey: "INV-E"}
	holdIntent(t, l, "payment.collect", "invoice:E", ref)
	require.NoError(t, c.Failure(ctx, task.ID, camunda7.FailureRequest{WorkerID: worker, ErrorMessage: "payment outcome unknown", Retries: 0}))

	out := mustEffects(t, "show", "invoice:E")
	assert.Contains(t, out, "engine: task "+task.ID)
	assert.Regexp(t, `(?m)^\s+retries\s+0 \(incident\)$`, out)
	assert.Regexp(t, `(?m)^\s+worker\s+`+worker+`$`, out)
	assert.Contains(t, out, "payment outcome unknown")
	assert.Contains(t, out, "open incidents (1):")
	assert.Contains(t, out, admin.IncidentTypeFailedExternalTask)

	out = mustEffectsAs(t, testenv.AliceLogin, "resolve", "invoice:E", "--as", "confirmed", "--provider-ref", "ch_E",
		"--reason", "found in the provider dashboard", "--operator", "alice")
	out = mustEffectsAs(t, testenv.BobLogin, "approve", pendingID(t, out), "--operator", "bob", "--reason", "agreed")
	assert.Contains(t, out, "is now confirmed")
	assert.Contains(t, out, "engine: retries set to 1 on task "+task.ID)

	got, err := c.ExternalTask(ctx, task.ID)
	require.NoError(t, err)
	require.NotNil(t, got.Retries)
	assert.Equal(t, 1, *got.Retries)
	incidents, err := c.Incidents(ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	assert.Empty(t, incidents)

	// The workflow resumes: the task is fetched again and completes from the ledger.
	again := fetch()
	require.Equal(t, task.ID, again.ID)
	o, err := l.Do(ctx, idempotency.Intent{Scope: "payment.collect", Key: "invoice:E", Request: order{"invoice:E"},
		Task: idempotency.TaskRef{Actor: worker, TaskID: again.ID}}, noDispatch(t))
	require.NoError(t, err)
	assert.True(t, o.Replayed)
	assert.Equal(t, "ch_E", o.ProviderRef)
	require.NoError(t, c.Complete(ctx, again.ID, camunda7.CompleteRequest{WorkerID: worker}))
	hpi, err := c.HistoricProcessInstance(ctx, pi.ID)
	require.NoError(t, err)
	assert.Equal(t, "COMPLETED", hpi.State)

	// Now the task is gone: show and a resolve of another intent on it say so.
	out = mustEffects(t, "show", "invoice:E")
	assert.Contains(t, out, "engine: task "+task.ID+" gone (completed or cancelled)")
	holdIntent(t, l, "payment.collect", "invoice:E2", ref)
	out = mustEffectsAs(t, testenv.AliceLogin, "resolve", "invoice:E2", "--as", "rejected", "--reason", "never reached the provider", "--operator", "alice")
	assert.Contains(t, out, "is now rejected (error code REJECTED)")
	assert.Contains(t, out, "engine: task "+task.ID+" gone; nothing to do in the engine")
}

func TestEffectsPrune(t *testing.T) {
	l := effectsEnv(t)
	ctx := testenv.Context(t, time.Minute)
	confirmIntent(t, l, "payment.collect", "invoice:P1")
	confirmIntent(t, l, "mail.send", "welcome:P2")
	holdIntent(t, l, "payment.collect", "invoice:P3", idempotency.TaskRef{Actor: "w"})

	out := mustEffects(t, "prune", "--older-than", "30d")
	assert.Contains(t, out, "pruned 0 settled intents")
	for _, short := range []string{"0s", "1h", "47h"} { // the provider window is 24h: at least 48h
		_, err := effects(t, "prune", "--older-than", short)
		assert.ErrorIs(t, err, idempotency.ErrRetentionTooShort, short)
	}

	pool := testenv.DB(t)
	_, err := pool.Exec(ctx, `UPDATE extworker_intents SET updated_at = now() - interval '31 days' WHERE namespace = $1`, l.Namespace())
	require.NoError(t, err)
	out = mustEffects(t, "prune", "--older-than", "30d")
	assert.Contains(t, out, "pruned 2 settled intents")
	for _, k := range [][2]string{{"payment.collect", "invoice:P1"}, {"mail.send", "welcome:P2"}} {
		_, err := l.Operations().Get(ctx, k[0], k[1])
		assert.ErrorIs(t, err, idempotency.ErrNotFound, k)
	}
	r, err := l.Operations().Get(ctx, "payment.collect", "invoice:P3")
	require.NoError(t, err, "a held intent is never pruned")
	assert.Equal(t, idempotency.StateOperatorHold, r.State)
	events, err := l.Operations().Events(ctx, "payment.collect", "invoice:P3")
	require.NoError(t, err)
	assert.Len(t, events, 4)

	out = mustEffects(t, "show", "invoice:P1", "--scope", "payment.collect")
	assert.Contains(t, out, "pruned: a tombstone refuses to dispatch it again")
	assert.Regexp(t, `(?m)^provider ref\s+ref-invoice:P1$`, out)
	assert.Contains(t, out, "events (3):", "a pruned intent's events stay")

	var got pruneJSON
	require.NoError(t, json.Unmarshal([]byte(mustEffects(t, "prune", "--older-than", "30d", "--json")), &got))
	assert.Equal(t, int64(0), got.Pruned)
	assert.Equal(t, l.Namespace(), got.Namespace)
}

// mustState returns an intent's state.
func mustState(t *testing.T, l *idempotency.Ledger, scope, key string) idempotency.State {
	t.Helper()
	r, err := l.Operations().Get(context.Background(), scope, key)
	require.NoError(t, err)
	return r.State
}

// Keys, provider messages and incident messages come from outside: nothing the CLI prints
// of them, in tables, in show, in JSON or in its errors, reaches the terminal as an
// escape sequence or a control character.
func TestEffectsStripsTerminalEscapes(t *testing.T) {
	l := effectsEnv(t)
	ctx := testenv.Context(t, time.Minute)
	key := "invoice:\x1b[2J\x1b[1;1Hforged\x1b]0;title\x07\u009b31m\u202e"
	in := idempotency.Intent{Scope: "payment.collect", Key: key, Request: order{"x"}, Task: idempotency.TaskRef{Actor: "w\x1b[31m"}}
	_, err := l.Do(ctx, in, idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		return idempotency.Result{}, idempotency.Rejected("DECLINED", "card \x1b]8;;http://evil\x1b\\declined\x1b]8;;\x1b\\ \r overwritten")
	}})
	require.Equal(t, failure.KindBPMNError, failure.Classify(err).Kind)
	clean := func(what, out string) {
		t.Helper()
		assert.NotRegexp(t, "[\x00-\x08\x0b-\x1f\x7f\u0080-\u009f\u202a-\u202e\u2066-\u2069]", out, "%s printed a control character", what)
	}
	for _, args := range [][]string{{"list"}, {"list", "--json"}, {"show", key}, {"show", key, "--json"}} {
		out := mustEffects(t, args...)
		clean(strings.Join(args, " "), out)
		assert.Contains(t, out, "forged", "the printable text stays")
	}
	var out, errOut bytes.Buffer
	err = run([]string{"effects", "resolve", key, "--as", "rejected", "--reason", "r", "--operator", "o"}, &out, &errOut)
	require.Error(t, err, "a rejected intent is not resolved again")
	clean("the error", termsafe.String(err.Error()))
}

// show links a compensating intent and its original both ways.
func TestEffectsShowCompensation(t *testing.T) {
	l := effectsEnv(t)
	ctx := testenv.Context(t, time.Minute)
	confirmIntent(t, l, "payment.collect", "invoice:C1")
	_, err := l.Do(ctx, idempotency.Intent{Scope: "payment.refund", Key: "invoice:C1:refund", Request: order{"r"},
		Compensates: idempotency.IntentRef{Scope: "payment.collect", Key: "invoice:C1"}},
		idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
			return idempotency.Result{ProviderRef: "re_C1"}, nil
		}})
	require.NoError(t, err)
	out := mustEffects(t, "show", "invoice:C1")
	assert.Regexp(t, `(?m)^state\s+compensated$`, out)
	assert.Contains(t, out, "compensated by: payment.refund / invoice:C1:refund (confirmed, provider ref re_C1)")
	out = mustEffects(t, "show", "invoice:C1:refund")
	assert.Contains(t, out, "compensates: payment.collect / invoice:C1 (compensated)")
}

// resolveVerdict refuses, in one error naming every problem, what the ledger would
// refuse, before anything is opened.
func TestResolveVerdict(t *testing.T) {
	for _, c := range []struct {
		as, reason, ref, code string
		values                bool
		want                  idempotency.State
		problems              []string
	}{
		{as: "confirmed", reason: "seen", ref: "ch_1", want: idempotency.StateConfirmed},
		{as: "rejected", reason: "seen", code: "DECLINED", want: idempotency.StateRejected},
		{as: "retry", reason: "never got it", want: idempotency.StatePrepared},
		{as: "close", reason: "refunded by hand", want: idempotency.VerdictClose},
		{problems: []string{"--as confirmed|rejected|retry|close is required", "--reason is required"}},
		{as: "maybe", reason: "x", problems: []string{`--as "maybe": must be`}},
		{as: "confirmed", reason: " ", problems: []string{"--reason is required", "--provider-ref is required with --as confirmed"}},
		{as: "confirmed", reason: "x", ref: "r", code: "C", problems: []string{"--error-code only goes with --as rejected"}},
		{as: "retry", reason: "x", values: true, problems: []string{"--provider-ref and --value go with --as confirmed, not retry"}},
		{as: "close", reason: "x", ref: "r", problems: []string{"--provider-ref and --value go with --as confirmed, not close"}},
	} {
		got, err := resolveVerdict(c.as, c.reason, c.ref, c.code, c.values)
		if len(c.problems) == 0 {
			require.NoError(t, err, "%+v", c)
			assert.Equal(t, c.want, got)
			continue
		}
		require.Error(t, err, "%+v", c)
		for _, p := range c.problems {
			assert.Contains(t, err.Error(), p)
		}
	}
}
