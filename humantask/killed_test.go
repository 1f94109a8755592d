package humantask_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/failpoint"
	"github.com/extworker/extworker/internal/testenv"
)

// The crash-point rows of the completion service: a service process (this test binary
// run again, built with -tags failpoints) SIGKILLed at a failpoint inside the ledger's Do
// while it completes a task; then a fresh process gets the same command (same
// Idempotency-Key, same body), sent again as a client does until it is answered. Each row
// asserts: the engine accepted one completion of the task, its history's marker names the
// command, the retry's answer is the command's 200, the same bytes as every later replay,
// and another command gets 409 naming who completed the task.
//
// Both tiers: the service's defaults (the ledger lease of humantask.Config, 20s: a retry
// waits it out, answered 503 with Retry-After meanwhile), and a short lease (2s).

// answer is one answer a client got.
type answer struct {
	status     int
	body       []byte
	retryAfter time.Duration
}

var httpClient = &http.Client{Timeout: 60 * time.Second}

// post sends a completion to base as user; err is a connection error (no answer).
func post(ctx context.Context, base, task, user, groups, command, ifMatch, body string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tasks/"+task+"/complete", bytes.NewReader([]byte(body)))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("X-User", user)
	if groups != "" {
		req.Header.Set("X-Groups", groups)
	}
	req.Header.Set("Idempotency-Key", command)
	req.Header.Set("If-Match", ifMatch)
	resp, err := httpClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, body: b}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		a.retryAfter = time.Duration(s) * time.Second
	}
	return a, nil
}

// untilAnswered sends the command to base until it gets an answer other than 503,
// waiting Retry-After after a 503 and a moment after a connection error, as a client
// does; it returns that answer and the 503s it got.
func untilAnswered(t *testing.T, within time.Duration, base, task, user, command, ifMatch, body string) (answer, int) {
	t.Helper()
	ctx := testenv.Context(t, within)
	unsettled := 0
	for {
		a, err := post(ctx, base, task, user, "", command, ifMatch, body)
		wait := 200 * time.Millisecond
		switch {
		case err == nil && a.status != http.StatusServiceUnavailable:
			return a, unsettled
		case err == nil:
			unsettled++
			wait = a.retryAfter
		case ctx.Err() != nil:
			t.Fatalf("the command was not answered within %v: %v", within, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the command was not answered within %v (%d answers 503)", within, unsettled)
		case <-time.After(wait):
		}
	}
}

// crashRow is one crash point: where the process dies, the intent's state it leaves, and
// the state the retry settles it in.
type crashRow struct {
	point, leftIn, settledIn string
}

var crashRows = []crashRow{
	// dispatched committed, the engine not called: the retry finds the task waiting (once
	// the lease has run out) and completes it
	{failpoint.AfterDispatchMark, "dispatched", "confirmed"},
	// the engine completed the task, the ledger not told: the retry settles it from the
	// engine's history (once the lease has run out), without completing again
	{failpoint.AfterProviderAnswer, "dispatched", "reconciled"},
	// settled: the retry is answered from the ledger at once
	{failpoint.AfterConfirm, "confirmed", "confirmed"},
}

func TestServiceKilledAtCrashPoints(t *testing.T) {
	testenv.NeedFailpoints(t)
	for _, tier := range []struct {
		name, lease string
		within      time.Duration // a bound on the retry's wait, not the lease
	}{{"defaults", "", 4 * time.Minute}, {"short", "2s", time.Minute}} {
		t.Run(tier.name, func(t *testing.T) {
			if tier.name == "defaults" && testing.Short() && !testenv.InCI() {
				t.Skip("the defaults tier waits out the service's lease; -short skips it outside CI")
			}
			for _, row := range crashRows {
				t.Run(row.point, func(t *testing.T) {
					t.Parallel() // the rows of a tier wait out their leases together
					runCrashRow(t, row, tier.lease, tier.within)
				})
			}
		})
	}
}

func runCrashRow(t *testing.T, row crashRow, lease string, within time.Duration) {
	start := time.Now()
	e := newEnv(t, nil)
	engineURL, completions := countingEngine(t)
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "alice")
	const form = `{"approved": true, "note": "crash row"}`

	dying := startService(t, procOpts{engine: engineURL, ns: e.ns, lease: lease, failpoint: row.point})
	_, err := post(testenv.Context(t, time.Minute), dying.url(), task, "alice", "", "crash-1", tag, form)
	require.Error(t, err, "the process answered instead of dying at %s", row.point)
	select {
	case <-dying.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the process did not end after the connection broke")
	}
	require.True(t, dying.killedBy(), "the process ended with %v, not by its failpoint", dying.err)
	assert.Equal(t, row.leftIn, e.intentState(t), "the dead process's intent")
	wantCompleted := int32(0)
	if row.point != failpoint.AfterDispatchMark {
		wantCompleted = 1
	}
	assert.Equal(t, wantCompleted, completions.Load(), "completions the engine accepted before the kill")

	fresh := startService(t, procOpts{engine: engineURL, ns: e.ns, lease: lease})
	retry, unsettled := untilAnswered(t, within, fresh.url(), task, "alice", "crash-1", tag, form)
	took := time.Since(start)
	require.Equal(t, http.StatusOK, retry.status, string(retry.body))
	assert.JSONEq(t, completedBody(t, task, "crash-1", "alice"), string(retry.body))
	replay, err := post(testenv.Context(t, time.Minute), fresh.url(), task, "alice", "", "crash-1", tag, form)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, replay.status)
	assert.Equal(t, retry.body, replay.body, "the retry's answer and a replay's are the same bytes")

	other, err := post(testenv.Context(t, time.Minute), fresh.url(), task, "bob", "", "crash-2", tag, `{"approved": false}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, other.status, string(other.body))
	var b map[string]string
	require.NoError(t, json.Unmarshal(other.body, &b))
	assert.Equal(t, "alice", b["completedBy"], "the 409 names who completed the task with the first command")

	assert.Equal(t, int32(1), completions.Load(), "the engine accepted one completion of the task")
	assert.Equal(t, map[string]string{"command": "crash-1", "user": "alice"}, e.marker(t, task))
	assert.Equal(t, row.settledIn, e.intentState(t))
	t.Logf("%s: retry answered after %v (%d answers 503 meanwhile)", row.point, took.Round(100*time.Millisecond), unsettled)
	if row.point == failpoint.AfterConfirm {
		assert.Zero(t, unsettled, "a settled command is answered at once")
	}
}
