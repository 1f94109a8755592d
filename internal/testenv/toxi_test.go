package testenv

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// echoServer answers every connection with what it receives, and records it all.
type echoServer struct {
	addr     string
	received Buffer
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e := &echoServer{addr: ln.Addr().String()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, io.TeeReader(c, &e.received))
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return e
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads as many bytes back, returning what came and how long it
// took; the read gives up after limit.
func roundTrip(t *testing.T, c net.Conn, msg string, limit time.Duration) (string, time.Duration, error) {
	t.Helper()
	start := time.Now()
	require.NoError(t, c.SetDeadline(start.Add(limit)))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", time.Since(start), err
	}
	buf := make([]byte, len(msg))
	n, err := io.ReadFull(c, buf)
	return string(buf[:n]), time.Since(start), err
}

func TestToxiForwardsAndAddsLatency(t *testing.T) {
	e := startEcho(t)
	p := Toxi(t, "echo", e.addr)
	c := dial(t, p.Addr())
	got, _, err := roundTrip(t, c, "hello", 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "hello", got)

	p.Add("slow", Downstream, Latency{Delay: 400 * time.Millisecond})
	got, took, err := roundTrip(t, c, "again", 5*time.Second)
	require.NoError(t, err, "latency applies to an open connection")
	assert.Equal(t, "again", got)
	assert.GreaterOrEqual(t, took, 400*time.Millisecond)
	t.Logf("downstream latency 400ms: round trip %v", took)

	p.Remove("slow")
	_, took, err = roundTrip(t, c, "fast", 5*time.Second)
	require.NoError(t, err)
	assert.Less(t, took, 400*time.Millisecond, "removed")
}

// A downstream timeout toxic is the lost answer: the server gets and handles the
// request, the client hears nothing; removing the toxic closes the connection it held.
func TestToxiTimeoutLosesTheAnswer(t *testing.T) {
	var handled atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled.Add(1)
		_, _ = io.WriteString(w, "done")
	}))
	t.Cleanup(srv.Close)
	p := Toxi(t, "http", strings.TrimPrefix(srv.URL, "http://"))
	// Keep-alive, as the engine's HTTP server does: a server that closes the connection
	// after answering would pass its close on even though the answer was dropped.
	client := &http.Client{Timeout: 700 * time.Millisecond, Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)

	p.Add("silence", Downstream, Timeout{})
	_, err := client.Get("http://" + p.Addr() + "/charge")
	require.Error(t, err, "no answer")
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout(), "the client timed out: %v", err)
	assert.EqualValues(t, 1, handled.Load(), "the server handled the request whose answer was lost")

	held := dial(t, p.Addr())
	_, err = io.WriteString(held, "GET /held HTTP/1.1\r\nHost: toxi\r\n\r\n")
	require.NoError(t, err)
	Eventually(t, 5*time.Second, "the held request to reach the server", func() (bool, error) { return handled.Load() == 2, nil })
	p.Remove("silence")
	require.NoError(t, held.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = held.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "removing a timeout toxic closes the connections it held")

	resp, err := client.Get("http://" + p.Addr() + "/charge")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "done", string(body))

	// With a duration, the connection is closed after that long.
	p.Add("closing", Downstream, Timeout{After: 200 * time.Millisecond})
	c := dial(t, p.Addr())
	_, took, err := roundTrip(t, c, "x", 5*time.Second)
	assert.ErrorIs(t, err, io.EOF)
	assert.GreaterOrEqual(t, took, 200*time.Millisecond)
	t.Logf("timeout toxic (200ms): connection closed after %v", took)
}

func TestToxiResetPeer(t *testing.T) {
	e := startEcho(t)
	p := Toxi(t, "echo", e.addr)
	p.Add("reset", Upstream, ResetPeer{})
	c := dial(t, p.Addr()) // the toxic is there as the connection opens: a real RST
	_, took, err := roundTrip(t, c, "lost", 5*time.Second)
	require.Error(t, err)
	assert.True(t, errors.Is(err, syscall.ECONNRESET), "connection reset by peer: %v", err)
	assert.Less(t, took, 2*time.Second)
	assert.Empty(t, e.received.String(), "the data never reached the server")
}

func TestToxiLimitData(t *testing.T) {
	e := startEcho(t)
	p := Toxi(t, "echo", e.addr)
	p.Add("short", Downstream, LimitData{Bytes: 10})
	c := dial(t, p.Addr())
	got, _, err := roundTrip(t, c, strings.Repeat("a", 100), 5*time.Second)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, strings.Repeat("a", 10), got, "10 bytes, then the connection closed")
}

func TestToxiBandwidth(t *testing.T) {
	e := startEcho(t)
	p := Toxi(t, "echo", e.addr)
	p.Add("thin", Downstream, Bandwidth{KBPerSecond: 50})
	c := dial(t, p.Addr())
	msg := strings.Repeat("b", 25_000)
	got, took, err := roundTrip(t, c, msg, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, msg, got)
	assert.GreaterOrEqual(t, took, 400*time.Millisecond, "25 KB at 50 KB/s take about 500ms")
	t.Logf("25 KB at 50 KB/s: %v", took)
}

func TestToxiSlicer(t *testing.T) {
	e := startEcho(t)
	p := Toxi(t, "echo", e.addr)
	p.Add("pieces", Downstream, Slicer{AverageSize: 1, Delay: 30 * time.Millisecond})
	c := dial(t, p.Addr())
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	_, err := c.Write([]byte("0123456789"))
	require.NoError(t, err)
	var got []byte
	reads := 0
	buf := make([]byte, 64)
	for len(got) < 10 {
		n, err := c.Read(buf)
		require.NoError(t, err)
		got = append(got, buf[:n]...)
		reads++
	}
	assert.Equal(t, "0123456789", string(got), "sliced, not altered")
	assert.GreaterOrEqual(t, reads, 5, "the answer came in pieces")
	t.Logf("10 bytes sliced by 1 byte every 30ms: %d reads", reads)
}

func TestToxiDisableEnable(t *testing.T) {
	e := startEcho(t)
	p := Toxi(t, "echo", e.addr)
	open := dial(t, p.Addr())
	_, _, err := roundTrip(t, open, "up", 5*time.Second)
	require.NoError(t, err)

	p.Disable()
	_, err = net.Dial("tcp", p.Addr())
	assert.ErrorIs(t, err, syscall.ECONNREFUSED, "refused while disabled")
	require.NoError(t, open.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = open.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "open connections are dropped")

	p.Enable()
	got, _, err := roundTrip(t, dial(t, p.Addr()), "back", 5*time.Second)
	require.NoError(t, err, "the same address works again")
	assert.Equal(t, "back", got)
}

func TestToxiLoseOnce(t *testing.T) {
	t.Run("request", func(t *testing.T) {
		e := startEcho(t)
		p := Toxi(t, "echo", e.addr)
		fired := p.LoseOnce("commit", []byte("COMMIT"), LoseRequest)
		c := dial(t, p.Addr())
		got, _, err := roundTrip(t, c, "begin", 5*time.Second)
		require.NoError(t, err, "other data passes")
		assert.Equal(t, "begin", got)
		_, _, err = roundTrip(t, c, "-COMMIT-", 5*time.Second)
		assert.ErrorIs(t, err, io.EOF, "the connection closed")
		requireClosed(t, fired)
		assert.Equal(t, "begin", e.received.String(), "the marked request never reached the server")

		got, _, err = roundTrip(t, dial(t, p.Addr()), "COMMIT", 5*time.Second)
		require.NoError(t, err, "one shot")
		assert.Equal(t, "COMMIT", got)
	})
	t.Run("answer", func(t *testing.T) {
		e := startEcho(t)
		p := Toxi(t, "echo", e.addr)
		fired := p.LoseOnce("commit", []byte("COMMIT"), LoseAnswer)
		c := dial(t, p.Addr())
		_, _, err := roundTrip(t, c, "begin", 5*time.Second)
		require.NoError(t, err)
		got, _, err := roundTrip(t, c, "COMMIT", 5*time.Second)
		assert.ErrorIs(t, err, io.EOF, "no answer, the connection closed")
		assert.Empty(t, got)
		requireClosed(t, fired)
		assert.Equal(t, "beginCOMMIT", e.received.String(), "the server got the marked request")

		got, _, err = roundTrip(t, dial(t, p.Addr()), "COMMIT", 5*time.Second)
		require.NoError(t, err, "one shot")
		assert.Equal(t, "COMMIT", got)
		p.Remove("commit")
		got, _, err = roundTrip(t, dial(t, p.Addr()), "after", 5*time.Second)
		require.NoError(t, err, "removed")
		assert.Equal(t, "after", got)
	})
}

func requireClosed(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	default:
		t.Fatal("the fault did not report firing")
	}
}

// LoseOnce on a real PostgreSQL conversation (pgx, extended protocol, one statement that
// is its own transaction, without TLS), armed on a connection already open: with LoseAnswer the row is
// committed and the client gets an error; with LoseRequest the row never is.
func TestToxiLoseOncePostgres(t *testing.T) {
	direct := DB(t)
	ctx := Context(t, time.Minute)
	table := "toxi_" + strings.ReplaceAll(Unique("t"), "-", "_")
	_, err := direct.Exec(ctx, "CREATE TABLE "+table+" (v text PRIMARY KEY)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = direct.Exec(context.Background(), "DROP TABLE "+table) })

	u, err := url.Parse(DBURL())
	require.NoError(t, err)
	p := Toxi(t, "postgres", u.Host)
	u.Host = p.Addr()
	q := u.Query()
	q.Set("sslmode", "disable") // plaintext, for the marker to be seen
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	insert := func(v string) error {
		_, err := pool.Exec(ctx, "INSERT INTO "+table+" (v) VALUES ($1)", v)
		return err
	}
	require.NoError(t, insert("warm-up"), "a connection is open before the fault is armed")
	count := func(v string) int {
		var n int
		require.NoError(t, direct.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE v = $1", v).Scan(&n))
		return n
	}

	fired := p.LoseOnce("answer", []byte("marked-answer"), LoseAnswer)
	require.Error(t, insert("marked-answer"), "the answer is lost")
	requireClosed(t, fired)
	assert.Equal(t, 1, count("marked-answer"), "committed all the same")
	p.Remove("answer")

	fired = p.LoseOnce("request", []byte("marked-request"), LoseRequest)
	require.Error(t, insert("marked-request"), "the request is lost")
	requireClosed(t, fired)
	assert.Equal(t, 0, count("marked-request"), "never reached the server")
	require.NoError(t, insert("after"), "one shot: the next statement passes")
}
