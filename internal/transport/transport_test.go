package transport_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/transport"
)

// post sends a POST of body to url with ctx tracked, and returns the error and whether
// the request was written in full.
func post(t *testing.T, ctx context.Context, url string, body io.Reader) (error, bool) {
	t.Helper()
	ctx, w := transport.Track(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	require.NoError(t, err)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err == nil {
		_ = resp.Body.Close()
	}
	return err, w.Load()
}

// closedURL is the address of a listener that was closed: connecting is refused.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr
}

// failingBody yields some bytes, then fails: the request cannot be written in full.
type failingBody struct{ sent bool }

func (b *failingBody) Read(p []byte) (int, error) {
	if b.sent {
		return 0, errors.New("body source failed")
	}
	b.sent = true
	return copy(p, `{"half":`), nil
}

// Track tells a request that never left whole (no answer, and nothing the server could
// act on) from one written in full whose answer was lost.
func TestTrack(t *testing.T) {
	// Reads the whole request, then drops the connection without an answer.
	dropAfterReading := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(dropAfterReading.Close)
	// Reads the whole request, then answers nothing until the client gives up.
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(hang.Close)
	// Answers.
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(ok.Close)
	background := func() (context.Context, context.CancelFunc) { return t.Context(), func() {} }
	cancelled := func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		return ctx, cancel
	}
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(t.Context(), 200*time.Millisecond)
	}

	for name, tc := range map[string]struct {
		ctx         func() (context.Context, context.CancelFunc)
		url         string
		body        func() io.Reader
		wantErr     bool
		wantWritten bool
	}{
		"connection refused":         {background, closedURL(t), nil, true, false},
		"context ended before":       {cancelled, ok.URL, nil, true, false},
		"body failed while written":  {background, ok.URL, func() io.Reader { return &failingBody{} }, true, false},
		"dropped after reading it":   {background, dropAfterReading.URL, nil, true, true},
		"timed out waiting":          {short, hang.URL, nil, true, true},
		"answered":                   {background, ok.URL, nil, false, true},
		"answered, with a body sent": {background, ok.URL, func() io.Reader { return strings.NewReader(`{"a":1}`) }, false, true},
	} {
		t.Run(name, func(t *testing.T) {
			body := io.Reader(bytes.NewReader([]byte(`{}`)))
			if tc.body != nil {
				body = tc.body()
			}
			ctx, cancel := tc.ctx()
			defer cancel()
			err, written := post(t, ctx, tc.url, body)
			assert.Equal(t, tc.wantErr, err != nil, "error: %v", err)
			assert.Equal(t, tc.wantWritten, written)
		})
	}
}

// Reset forgets a request written before; a trace the context already carried still
// hears of every request.
func TestWrittenResetAndComposition(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	var outer int
	ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { outer++ },
	})
	ctx, w := transport.Track(ctx)
	assert.False(t, w.Load(), "nothing sent yet")
	for i := range 2 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.True(t, w.Load(), "request %d", i)
		w.Reset()
		assert.False(t, w.Load(), "after Reset")
	}
	assert.Equal(t, 2, outer, "the outer trace saw both requests")
	assert.False(t, new(transport.Written).Load(), "the zero value is not written")
}

func TestDescribe(t *testing.T) {
	cause := errors.New("connection reset by peer")
	assert.Equal(t, "complete external task 1: not sent: connection reset by peer",
		transport.Describe("complete external task 1", false, cause))
	assert.Equal(t, "pay.example charge: sent, no answer: connection reset by peer",
		transport.Describe("pay.example charge", true, cause))
}

func TestReadLimited(t *testing.T) {
	broken := errors.New("broken pipe")
	for name, tc := range map[string]struct {
		r        io.Reader
		limit    int64
		wantData string
		wantOver bool
		wantErr  error
	}{
		"empty":            {strings.NewReader(""), 4, "", false, nil},
		"under the limit":  {strings.NewReader("abc"), 4, "abc", false, nil},
		"at the limit":     {strings.NewReader("abcd"), 4, "abcd", false, nil},
		"one over":         {strings.NewReader("abcde"), 4, "abcde", true, nil},
		"far over":         {strings.NewReader(strings.Repeat("x", 1000)), 4, "xxxxx", true, nil},
		"read fails":       {io.MultiReader(strings.NewReader("ab"), iotestErr{broken}), 4, "ab", false, broken},
		"read fails, over": {io.MultiReader(strings.NewReader("abcdef"), iotestErr{broken}), 4, "abcde", true, nil},
	} {
		t.Run(name, func(t *testing.T) {
			data, over, err := transport.ReadLimited(tc.r, tc.limit)
			assert.Equal(t, tc.wantData, string(data))
			assert.Equal(t, tc.wantOver, over)
			assert.ErrorIs(t, err, tc.wantErr)
			if tc.wantErr == nil {
				assert.NoError(t, err)
			}
		})
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const limit = 5 * time.Minute
	for _, tc := range []struct {
		header string
		want   time.Duration
	}{
		{"", 0},
		{"  ", 0},
		{"0", 0},
		{"7", 7 * time.Second},
		{" 120 ", 2 * time.Minute},
		{"300", limit},
		{"301", limit},
		{"99999999999999999999999", limit},
		{"-5", 0},
		{"1.5", 0},
		{"soon", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{now.Add(time.Hour).Format(http.TimeFormat), limit},
		{now.Add(30 * time.Second).Format(time.RFC850), 30 * time.Second},
	} {
		assert.Equal(t, tc.want, transport.ParseRetryAfter(tc.header, now, limit), "%q", tc.header)
	}
}
