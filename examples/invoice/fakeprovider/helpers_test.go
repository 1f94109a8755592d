package fakeprovider

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: Close must end every
// handler, held ones included. Kept-alive client connections are not leaks.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// net/http lingers 500ms after answering a request whose body it did not read
		// to the end (the 413), so the client gets the answer rather than a reset.
		goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"),
	)
}

// startTCP starts a provider on loopback with a client that opens a fresh connection
// per request: on a reused connection net/http itself resends a request carrying an
// Idempotency-Key that got no answer, which would hide a dropped answer.
func startTCP(t *testing.T, o Options) (*Server, *Client) {
	t.Helper()
	s, err := StartWith(o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return s, &Client{BaseURL: s.URL(), HTTP: &http.Client{Transport: tr}}
}

// memNet is an in-memory network of net.Pipe connections. Inside a testing/synctest
// bubble a goroutine blocked on a real socket is not durably blocked, so fake time
// would never advance; on a pipe it is, and the slow delay passes instantly.
type memNet struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newMemNet() *memNet { return &memNet{conns: make(chan net.Conn), done: make(chan struct{})} }

func (m *memNet) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case <-m.done:
		return nil, net.ErrClosed
	}
}

func (m *memNet) Close() error {
	m.once.Do(func() { close(m.done) })
	return nil
}

func (m *memNet) Addr() net.Addr { return memAddr{} }

func (m *memNet) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case m.conns <- server:
		return client, nil
	case <-m.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	return nil, net.ErrClosed
}

type memAddr struct{}

func (memAddr) Network() string { return "mem" }
func (memAddr) String() string  { return "provider.test" }

// startMem starts a provider on a memNet, for tests inside a synctest bubble.
func startMem(t *testing.T, o Options) (*Server, *Client) {
	t.Helper()
	o = o.WithDefaults()
	require.NoError(t, o.validate())
	m := newMemNet()
	s := serve(o, m)
	tr := &http.Transport{DialContext: m.dial, DisableKeepAlives: true}
	t.Cleanup(func() {
		require.NoError(t, s.Close())
		tr.CloseIdleConnections()
	})
	return s, &Client{BaseURL: s.URL(), HTTP: &http.Client{Transport: tr}}
}

// raw is one answer as it came over the wire.
type raw struct {
	status int
	header http.Header
	body   string
}

// send sends one request with c's HTTP client and returns the raw answer.
func send(t *testing.T, c *Client, method, path, key, body string) raw {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, c.BaseURL+path, bytes.NewBufferString(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.HTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return raw{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// entryFor returns the history entry with the given sequence number.
func entryFor(t *testing.T, s *Server, seq int64) Request {
	t.Helper()
	log := s.Log()
	require.GreaterOrEqual(t, int64(len(log)), seq, "history too short")
	return log[seq-1]
}
