package camunda7

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The decisions of a request's path, each a function of values: no engine, no server.

// A request that got no answer is not sent unless it was written in full first; then
// its outcome is unknown. The cause stays reachable either way.
func TestTransportErrorDecision(t *testing.T) {
	cause := errors.New("connection reset by peer")
	for _, tc := range []struct {
		written   bool
		want, not error
		safe      bool
		text      string
	}{
		{false, ErrNotSent, ErrUnknownOutcome, true, "complete external task 1: not sent: connection reset by peer"},
		{true, ErrUnknownOutcome, ErrNotSent, false, "complete external task 1: sent, no answer: connection reset by peer"},
	} {
		err := transportError("complete external task 1", cause, tc.written)
		assert.ErrorIs(t, err, tc.want, "written %v", tc.written)
		assert.NotErrorIs(t, err, tc.not, "written %v", tc.written)
		assert.ErrorIs(t, err, cause)
		assert.Equal(t, tc.safe, SafeToRetry(err))
		assert.EqualError(t, err, tc.text)
		var te *TransportError
		require.ErrorAs(t, err, &te)
		assert.Equal(t, tc.written, te.Sent)
	}
}

// Only a 401 to the first sending, with a token source that can invalidate the refused
// token, is sent once more.
func TestResendWithNewTokenDecision(t *testing.T) {
	for _, tc := range []struct {
		attempt     int
		invalidates bool
		status      int
		want        bool
	}{
		{1, true, http.StatusUnauthorized, true},
		{2, true, http.StatusUnauthorized, false},
		{1, false, http.StatusUnauthorized, false},
		{1, true, http.StatusForbidden, false},
		{1, true, http.StatusOK, false},
		{1, true, http.StatusInternalServerError, false},
	} {
		assert.Equal(t, tc.want, resendWithNewToken(tc.attempt, tc.invalidates, tc.status), "%+v", tc)
	}
}

func TestEncodeBodyDecision(t *testing.T) {
	payload, ctype, err := encodeBody(call{op: "op"})
	require.NoError(t, err)
	assert.Nil(t, payload)
	assert.Empty(t, ctype)

	payload, ctype, err = encodeBody(call{op: "op", body: RawBody{ContentType: "multipart/form-data; boundary=x", Data: []byte("--x--")}})
	require.NoError(t, err)
	assert.Equal(t, "--x--", string(payload))
	assert.Equal(t, "multipart/form-data; boundary=x", ctype)

	payload, ctype, err = encodeBody(call{op: "op", body: map[string]int{"retries": 3}})
	require.NoError(t, err)
	assert.JSONEq(t, `{"retries":3}`, string(payload))
	assert.Equal(t, "application/json", ctype)

	_, _, err = encodeBody(call{op: "start process x", body: map[string]any{"c": make(chan int)}})
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorIs(t, err, ErrNotSent, "refused before anything was sent")
	assert.True(t, strings.HasPrefix(err.Error(), "start process x: encode request: "), err.Error())
}

// readAnswer turns a status, headers and a body as read into the call's result, with the
// classification the rest of extworker relies on.
func TestReadAnswerDecision(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	jsonH := hdr("Content-Type", "application/json")
	task := call{op: "complete external task 1", taskEndpoint: true}
	other := call{op: "get process instance 1"}
	const gone = `{"type":"RestException","message":"External task with id 1 does not exist","code":0}`
	const locked = `{"type":"RestException","message":"External Task 1 cannot be completed by worker 'a'. It is locked by worker 'b'.","code":0}`
	broken := errors.New("unexpected EOF")

	for name, tc := range map[string]struct {
		k          call
		a          engineAnswer
		want       []error // every one matches
		not        []error // none matches
		retryAfter time.Duration
		errAs      string // "Error", "ResponseError"; "" for nil
	}{
		"204, nothing expected": {k: task, a: engineAnswer{status: 204}},
		"200 read broken": {k: other, a: engineAnswer{status: 200, header: jsonH, data: []byte(`{"id"`), readErr: broken},
			want: []error{ErrMalformedResponse, ErrUnknownOutcome, broken}, not: []error{ErrNotSent}, errAs: "ResponseError"},
		"200 too large": {k: other, a: engineAnswer{status: 200, header: jsonH, data: []byte(`[1,2,3]`), over: true},
			want: []error{ErrResponseTooLarge, ErrMalformedResponse, ErrUnknownOutcome}, errAs: "ResponseError"},
		"200 with a Retry-After ignores it": {k: other, a: engineAnswer{status: 200, header: hdr("Retry-After", "7"), data: nil, readErr: broken},
			want: []error{ErrUnknownOutcome}, errAs: "ResponseError"},
		"task gone": {k: task, a: engineAnswer{status: 404, header: jsonH, data: []byte(gone)},
			want: []error{ErrTaskGone, ErrNotFound}, not: []error{ErrNotSent, ErrUnknownOutcome}, errAs: "Error"},
		"404 page on a task endpoint": {k: task, a: engineAnswer{status: 404, header: hdr("Content-Type", "text/html"), data: []byte("<html>Not Found</html>")},
			want: []error{ErrNotSent, ErrMalformedResponse}, not: []error{ErrTaskGone, ErrUnknownOutcome}, errAs: "ResponseError"},
		"404 elsewhere": {k: other, a: engineAnswer{status: 404, header: hdr("Content-Type", "text/html"), data: []byte("<html/>")},
			want: []error{ErrNotFound}, not: []error{ErrTaskGone, ErrNotSent, ErrUnknownOutcome}, errAs: "Error"},
		"locked by another worker": {k: task, a: engineAnswer{status: 400, header: jsonH, data: []byte(locked)},
			want: []error{ErrLockLost, ErrBadRequest}, not: []error{ErrUnknownOutcome}, errAs: "Error"},
		"401": {k: other, a: engineAnswer{status: 401}, want: []error{ErrUnauthorized}, errAs: "Error"},
		"429 with seconds": {k: other, a: engineAnswer{status: 429, header: hdr("Retry-After", "7")},
			want: []error{ErrThrottled}, not: []error{ErrUnknownOutcome}, retryAfter: 7 * time.Second, errAs: "Error"},
		"503 proxy page with a date": {k: other, a: engineAnswer{status: 503, at: at,
			header: hdr("Content-Type", "text/html", "Retry-After", at.Add(90*time.Second).Format(http.TimeFormat)), data: []byte("<html>busy</html>")},
			want: []error{ErrUnknownOutcome, ErrMalformedResponse}, not: []error{ErrNotSent}, retryAfter: 90 * time.Second, errAs: "ResponseError"},
		"500 from the engine": {k: other, a: engineAnswer{status: 500, header: jsonH,
			data: []byte(`{"type":"ProcessEngineException","message":"boom","code":0}`)},
			not: []error{ErrUnknownOutcome, ErrNotSent}, errAs: "Error"},
		"502 cut short": {k: other, a: engineAnswer{status: 502, header: hdr("Retry-After", "3"), readErr: io.ErrUnexpectedEOF},
			want: []error{ErrUnknownOutcome, io.ErrUnexpectedEOF}, retryAfter: 3 * time.Second, errAs: "ResponseError"},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.a.header == nil {
				tc.a.header = http.Header{}
			}
			if tc.a.at.IsZero() {
				tc.a.at = at
			}
			err := readAnswer(tc.k, tc.a, 1024)
			if tc.errAs == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), tc.k.op+": "), err.Error())
			for _, w := range tc.want {
				assert.ErrorIs(t, err, w)
			}
			for _, n := range tc.not {
				assert.NotErrorIs(t, err, n)
			}
			d, _ := RetryAfter(err)
			assert.Equal(t, tc.retryAfter, d)
			switch tc.errAs {
			case "Error":
				var e *Error
				assert.ErrorAs(t, err, &e)
			case "ResponseError":
				var e *ResponseError
				assert.ErrorAs(t, err, &e)
			}
		})
	}

	// A 2xx decodes into the call's target.
	var out struct{ ID string }
	require.NoError(t, readAnswer(call{op: "get", out: &out}, engineAnswer{status: 200, header: jsonH, data: []byte(`{"id":"42"}`)}, 1024))
	assert.Equal(t, "42", out.ID)
	// And the limit is named.
	err := readAnswer(call{op: "fetch"}, engineAnswer{status: 200, header: jsonH, over: true}, 1024)
	assert.ErrorContains(t, err, "1024-byte limit")
}

// The token of a request: none without a source; a source's failure is not sent.
func TestTokenDecision(t *testing.T) {
	c := newTestClient(t, Config{})
	tok, err := c.token(t.Context(), "op", 1)
	require.NoError(t, err)
	assert.Empty(t, tok)

	down := errors.New("idp down")
	c = newTestClient(t, Config{TokenSource: TokenSourceFunc(func(context.Context) (string, error) { return "", down })})
	for attempt, want := range map[int]string{1: "op: not sent: get bearer token: idp down",
		2: "op: not sent: get a new bearer token after the engine rejected one (401): idp down"} {
		_, err = c.token(t.Context(), "op", attempt)
		assert.ErrorIs(t, err, ErrNotSent)
		assert.ErrorIs(t, err, down)
		assert.EqualError(t, err, want)
	}
}
