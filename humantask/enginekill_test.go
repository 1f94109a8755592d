package humantask_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// TestEngineSIGKILLDuringCompletions: the engine's JVM is SIGKILLed while completions are
// on their way to it, at the service's shipped defaults (a service process with
// humantask.Config's lease and AnswerWithin, the daemon's engine client). The engine is
// an engine node of the test's own (testenv.StartCluster, one node), so that no other
// test's engine dies; it is kept down 90s, then started again (away about two minutes in
// all). Two users send a command each on every task (two tabs), again after every 503
// (after its Retry-After) and every connection error, as a client does, before, during
// and after the outage.
//
// Every task ends completed by one command: the only 200 of its commands, the one its
// history's marker names; the other command gets a 409 naming that user; every command
// answers the same bytes every time; no command is left unsettled in the ledger.
//
// It runs with the tests beyond one machine (make test-beyond), where engine clusters
// start one at a time.
func TestEngineSIGKILLDuringCompletions(t *testing.T) {
	const tasks, outage = 30, 90 * time.Second
	cluster := testenv.StartCluster(t, 1)
	e := &env{pool: testenv.DB(t), engine: cluster.NodeClient(t, 0), ns: testenv.Unique("ht-kill")}
	migrateOnce.Do(func() {
		_, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(e.pool))
		require.NoError(t, err)
	})
	t.Cleanup(func() {
		_, _ = e.pool.Exec(context.Background(), `DELETE FROM extworker_intents WHERE namespace = $1`, e.ns)
	})
	group := testenv.Unique("kill")
	e.key = testenv.DeployUserTask(t, e.engine, testenv.UserTaskProcess{CandidateGroups: []string{group}}).Key
	ids := make([]string, tasks)
	for i := range ids {
		id, err := e.taskOfNewInstance(testenv.Context(t, time.Minute))
		require.NoError(t, err)
		ids[i] = id
	}

	// In front of the node: a proxy that holds each completion 300ms before sending it
	// on (so that the kill finds completions on their way) and counts those in flight.
	target, err := url.Parse(cluster.NodeURL(0))
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	rp.ErrorLog = log.New(io.Discard, "", 0)
	var inFlight atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/complete") {
			inFlight.Add(1)
			defer inFlight.Add(-1)
			time.Sleep(300 * time.Millisecond) // the fault's schedule, not a wait for a condition
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	svc := startService(t, procOpts{engine: proxy.URL + target.Path, ns: e.ns}) // lease "": the defaults

	ctx := testenv.Context(t, 8*time.Minute)
	tags := make([]string, tasks)
	rec := newLoadRecord()
	base := func() string { return svc.url() }
	for i, task := range ids {
		tag, status := rec.load(ctx, base, task, "user-a", group)
		require.Equal(t, http.StatusOK, status)
		tags[i] = tag
	}

	var wg sync.WaitGroup
	starts := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range starts {
				var sub sync.WaitGroup
				for _, u := range []string{"user-a", "user-b"} {
					sub.Go(func() {
						rec.submit(ctx, base, ids[i], u, group, fmt.Sprintf("%s-%s", u, ids[i]), tags[i], `{"approved": true}`, false)
					})
				}
				sub.Wait()
			}
		})
	}
	go func() {
		for i := range ids {
			select {
			case starts <- i:
			case <-ctx.Done():
			}
		}
		close(starts)
	}()

	testenv.Eventually(t, 3*time.Minute, "5 commands answered and a completion on its way to the engine", func() (bool, error) {
		return rec.answered() >= 5 && inFlight.Load() > 0, nil
	})
	answeredAtKill, onTheWay := rec.answered(), inFlight.Load()
	kill := cluster.Kill(t, 0)
	t.Logf("SIGKILLed the engine's JVM (pid %d) with %d commands answered and %d completions on their way; dead after %v",
		kill.PID, answeredAtKill, onTheWay, kill.Dead.Round(time.Millisecond))
	// The outage's length, the fault's schedule: with the restart (20-60s), longer than
	// 100 reconciliations at the clients' pace of one a second, which put every command
	// whose outcome the kill left unknown on hold for an operator (the ledger's
	// MaxReconciliations, 100, counted each request's look at an engine that was down).
	<-time.After(outage)
	up := cluster.Restart(t, 0)
	upAt := time.Now()
	wg.Wait()
	require.NoError(t, ctx.Err(), "the users did not finish in time")
	t.Logf("engine back after %v; every command answered %v after that", up.Round(time.Millisecond), time.Since(upAt).Round(time.Millisecond))

	assert.Greater(t, rec.answered(), answeredAtKill, "commands answered after the kill")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	winners := map[string]string{}
	for c, r := range rec.commands {
		require.NotEmpty(t, r.answers, "command %s was never answered", c)
		for _, a := range r.answers[1:] {
			assert.Equal(t, string(r.answers[0].body), string(a.body), "command %s: the same bytes every time", c)
		}
		switch r.answers[0].status {
		case http.StatusOK:
			require.Empty(t, winners[r.task], "task %s answered 200 to two commands: %s and %s", r.task, winners[r.task], c)
			winners[r.task] = c
			assert.JSONEq(t, completedBody(t, r.task, c, r.user), string(r.answers[0].body))
		case http.StatusConflict:
		default:
			t.Errorf("command %s answered %d: %s", c, r.answers[0].status, r.answers[0].body)
		}
	}
	for c, r := range rec.commands {
		if r.answers[0].status == http.StatusConflict {
			var b map[string]string
			require.NoError(t, json.Unmarshal(r.answers[0].body, &b))
			assert.Equal(t, rec.commands[winners[r.task]].user, b["completedBy"], "command %s's 409 names the winner", c)
		}
	}
	for _, task := range ids {
		w := rec.commands[winners[task]]
		if assert.NotNil(t, w, "task %s completed by a command answered 200", task) {
			assert.Equal(t, map[string]string{"command": winners[task], "user": w.user}, e.marker(t, task), "task %s's marker", task)
		}
	}
	var unsettled, unknown int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state NOT IN ('confirmed', 'reconciled', 'rejected')),
		count(*) FILTER (WHERE reconciliations > 0) FROM extworker_intents WHERE namespace = $1`, e.ns).Scan(&unsettled, &unknown))
	assert.Zero(t, unsettled, "intents left unsettled")
	assert.Positive(t, unknown, "commands whose outcome the kill left unknown, reconciled while the engine was away")
	t.Logf("%d tasks, %d commands (%d of them unknown after the kill): answers 200×%d 409×%d 503×%d, connection errors %d, the most 503s for one command %d",
		tasks, len(rec.commands), unknown, rec.statuses[200], rec.statuses[409], rec.statuses[503], rec.connErrors, rec.max503())
}
