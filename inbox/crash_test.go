package inbox_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/failpoint"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/outbox"
)

// The crash-point rows of the events: a consumer or a relay in a process of its own (this
// test binary, run again as a child), killed by SIGKILL at a failpoint, then the work
// taken over by a consumer or relay in the test. Each row asserts: no event lost, no
// process started twice, no message correlated twice.

const childEnv = "EXTWORKER_INBOX_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

// child is a consumer ("consume", "kafka-consume") or a relay ("relay", "kafka-relay")
// that runs until its failpoint kills it; exit status 3 says it outlived its minute.
func child(mode string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, testenv.DBURL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	switch mode {
	case "consume":
		ec, err := camunda7.New(camunda7.Config{BaseURL: cmp.Or(os.Getenv(childEnv+"_ENGINE"), testenv.EngineURL())})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		e := env{ship: os.Getenv(childEnv + "_SHIP"), wait: os.Getenv(childEnv + "_WAIT"), paid: os.Getenv(childEnv + "_PAID")}
		c, err := inbox.NewConsumer(pool, admin.New(ec), testenv.AMQPURL(), e.decide,
			inbox.Config{Source: os.Getenv(childEnv + "_SOURCE"), Queue: os.Getenv(childEnv + "_QUEUE")})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		_ = c.Run(ctx)
	case "relay":
		pub := outbox.NewAMQPPublisher(testenv.AMQPURL())
		defer pub.Close()
		_ = outbox.NewRelay(pool, pub, outbox.RelayConfig{Namespace: os.Getenv(childEnv + "_NS"), PollInterval: 50 * time.Millisecond}).Run(ctx)
	case "kafka-consume", "kafka-relay": // kafka_crash_test.go
		if err := kafkaChild(ctx, pool, mode); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	return 3
}

// killedAt runs a child in mode with the failpoint and waits until the failpoint has
// killed it.
func killedAt(t *testing.T, mode, point string, vars ...string) {
	t.Helper()
	testenv.NeedFailpoints(t)
	cmd := startChild(t, mode, append(vars, failpoint.Env+"="+point)...)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "the child ended without being killed: %v", err)
		ws, _ := ee.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child ended with %v, not by its failpoint", err)
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the child did not reach failpoint %s within 90s", point)
	}
}

// startChild runs this test binary again as a child in mode, with vars; it is killed at
// cleanup if still running.
func startChild(t *testing.T, mode string, vars ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+mode), vars...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd
}

func (e env) childVars(b broker) []string {
	return []string{childEnv + "_SOURCE=" + e.source, childEnv + "_QUEUE=" + b.queue, childEnv + "_SHIP=" + e.ship, childEnv + "_WAIT=" + e.wait,
		childEnv + "_PAID=" + e.paid}
}

// TestConsumerKilledAfterTheEngineActed: the engine started the instance (or took the
// message) and the consumer died before recording it or acknowledging. The broker
// delivers the message again; the next consumer finds out from the engine what happened
// and sends nothing again.
func TestConsumerKilledAfterTheEngineActed(t *testing.T) {
	for _, do := range []string{"start", "correlate"} {
		t.Run(do, func(t *testing.T) {
			e := newEnv(t)
			b := newBroker(t)
			bk := testenv.Unique("INV")
			if do == "correlate" {
				e.startWaiting(t, bk)
			}
			id := "crash-" + bk
			b.publish(t, msg(id, payload{Do: do, BusinessKey: bk}))
			killedAt(t, "consume", failpoint.InboxAfterEngine, e.childVars(b)...)

			left := e.record(t, id)
			assert.Equal(t, inbox.StateProcessing, left.State, "the dead consumer's row")
			c := e.consumerVia(t, testenv.EngineURL(), quickTimeout, inbox.Config{Queue: b.queue, InFlightWindow: quickWindow})
			run(t, c)
			r := e.waitState(t, id, inbox.StateProcessed)
			assert.Contains(t, r.Reason, "reconciled")
			assert.GreaterOrEqual(t, r.Deliveries, 2, "delivered again (and again, once it had waited out the in-flight window)")
			// The row commits before the consumer counts it: wait for the count, which a
			// read straight after the row's state missed once under CI's load.
			testenv.Eventually(t, 10*time.Second, "the reconciliation counted", func() (bool, error) {
				return c.Stats().Reconciled.Load() >= 1, nil
			})
			assert.Equal(t, int64(1), c.Stats().Reconciled.Load())
			if do == "start" {
				assert.Equal(t, 1, e.instances(t, e.ship, bk), "instances")
			} else {
				assert.Equal(t, 1, e.correlations(t, bk), "correlations")
			}
		})
	}
}

// TestConsumerKilledAfterAck: the consumer died right after acknowledging; the producer
// then sends the event again. It is answered from the inbox.
func TestConsumerKilledAfterAck(t *testing.T) {
	e := newEnv(t)
	b := newBroker(t)
	bk := testenv.Unique("INV")
	id := "acked-" + bk
	m := msg(id, payload{Do: "start", BusinessKey: bk})
	b.publish(t, m)
	killedAt(t, "consume", failpoint.InboxAfterAck, e.childVars(b)...)
	assert.Equal(t, inbox.StateProcessed, e.record(t, id).State)

	b.publish(t, m)
	c := e.consumer(t, inbox.Config{Queue: b.queue})
	run(t, c)
	// At least the producer's copy; the broker may redeliver the first too, when the
	// SIGKILL came before its ack left the socket (seen under CI's load): a duplicate as well.
	testenv.Eventually(t, 30*time.Second, "the redelivery answered as a duplicate", func() (bool, error) {
		return c.Stats().Duplicates.Load() >= 1, nil
	})
	assert.Equal(t, int64(0), c.Stats().Started.Load())
	assert.Equal(t, 1, e.instances(t, e.ship, bk))
}

// TestRelayKilled: the outbox's relay dies before publishing (the business change and
// its event committed), or after the broker confirmed and before the event was marked
// published. Another relay publishes it (again, with the same id); the consumer starts
// one instance.
func TestRelayKilled(t *testing.T) {
	for _, point := range []string{failpoint.OutboxBeforePublish, failpoint.OutboxAfterPublish} {
		t.Run(point, func(t *testing.T) {
			e := newEnv(t)
			b := newBroker(t)
			ns := testenv.Unique("ns")
			bk := testenv.Unique("INV")
			id := "invoice.paid:" + bk
			m := msg(id, payload{Do: "start", BusinessKey: bk})
			ctx := testenv.Context(t, 60*time.Second)
			tx, err := e.pool.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, outbox.Add(ctx, tx, ns, outbox.Event{MessageID: id, Type: m.Type, RoutingKey: b.queue, Body: m.Body}))
			require.NoError(t, tx.Commit(ctx))

			killedAt(t, "relay", point, childEnv+"_NS="+ns)
			backlog, err := outbox.ReadBacklog(ctx, e.pool, ns)
			require.NoError(t, err)
			assert.Equal(t, 1, backlog.Unpublished, "the event is not marked published")

			pub := outbox.NewAMQPPublisher(testenv.AMQPURL())
			t.Cleanup(func() { _ = pub.Close() })
			// The dead relay's transaction holds the event until PostgreSQL has noticed
			// its connection closed; SKIP LOCKED passes over it until then.
			relay := outbox.NewRelay(e.pool, pub, outbox.RelayConfig{Namespace: ns})
			testenv.Eventually(t, 30*time.Second, "the second relay to publish the event", func() (bool, error) {
				n, err := relay.PublishPending(ctx)
				return n == 1, err
			})

			c := e.consumer(t, inbox.Config{Queue: b.queue})
			run(t, c)
			want := int64(1) // deliveries
			if point == failpoint.OutboxAfterPublish {
				want = 2 // the dead relay's publish and the second relay's
			}
			testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d deliveries handled", want), func() (bool, error) {
				st := c.Stats()
				return st.Started.Load()+st.Duplicates.Load() == want, nil
			})
			assert.Equal(t, int64(1), c.Stats().Started.Load())
			assert.Equal(t, want-1, c.Stats().Duplicates.Load())
			assert.Equal(t, 1, e.instances(t, e.ship, bk))
		})
	}
}

// TestDeadAttemptStillInFlight: a consumer dies while its start is on the way to the
// engine, held up in the network; the engine takes it after the broker has given the
// message to the next consumer. The next consumer must not look (and find nothing, and
// start a second instance) before the dead attempt's request can no longer land: it
// waits out the in-flight window, then finds the instance. The soak found this race
// (one invoice shipped twice).
func TestDeadAttemptStillInFlight(t *testing.T) {
	e := newEnv(t)
	b := newBroker(t)
	bk := testenv.Unique("INV")
	id := "inflight-" + bk
	b.publish(t, msg(id, payload{Do: "start", BusinessKey: bk}))

	// The network between the dying consumer and the engine: it holds the start until
	// released, then delivers it whatever became of its sender.
	engine, err := url.Parse(testenv.EngineURL())
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: engine.Scheme, Host: engine.Host})
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/start") {
			// All of the request, before its sender dies: the network has it.
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			arrived <- struct{}{}
			<-release
			// A context its sender's death does not cancel, with a Done channel: without one
			// the reverse proxy falls back on CloseNotify, and gives up on the dead sender.
			ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
			defer cancel()
			r = r.WithContext(ctx)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	cmd := startChild(t, "consume", append(e.childVars(b), childEnv+"_ENGINE="+srv.URL+engine.Path)...)
	select {
	case <-arrived:
	case <-time.After(60 * time.Second):
		t.Fatal("the child's start did not reach the network within 60s")
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	assert.Equal(t, inbox.StateProcessing, e.record(t, id).State, "the dead consumer's row")

	c := e.consumerVia(t, testenv.EngineURL(), 2*time.Second, inbox.Config{Queue: b.queue, InFlightWindow: 3 * time.Second, BackoffInitial: 100 * time.Millisecond})
	run(t, c)
	testenv.Eventually(t, 30*time.Second, "the next consumer to wait rather than look", func() (bool, error) {
		return c.Stats().Retried.Load() >= 1, nil
	})
	assert.Zero(t, c.Stats().Started.Load(), "started while the dead attempt's request was in flight")
	close(release) // the dead attempt's start lands now
	r := e.waitState(t, id, inbox.StateProcessed)
	assert.Contains(t, r.Reason, "reconciled")
	assert.Equal(t, 1, e.instances(t, e.ship, bk), "instances")
}
