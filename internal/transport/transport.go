// Package transport holds the mechanics that the engine client (camunda7) and the
// provider effect (idempotency/httpeffect) share for one HTTP request that may get no
// answer:
//
//   - whether the request was written in full to a connection before the failure
//     (Track), which is the line between "not sent" (it cannot have had an effect: send
//     it again) and "sent, no answer" (an unknown outcome: it may have had one);
//   - the one wording of that line in errors (Describe);
//   - reading an answer body within a size limit (ReadLimited);
//   - the Retry-After header (ParseRetryAfter).
//
// Each package keeps its own error types and sentinels (camunda7.ErrNotSent and
// camunda7.ErrUnknownOutcome; idempotency.NotSent for httpeffect): this package knows
// nothing of them, and imports nothing of extworker.
package transport

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Written records whether a request has been written in full to a connection. Track
// makes one; the zero value is a request not written.
type Written struct{ b atomic.Bool }

// Track returns ctx with an httptrace.ClientTrace (composed with any trace ctx already
// carries) that sets the returned Written once a request sent with that context has been
// written in full, body included. It never turns back by itself: if the HTTP transport
// writes the request once and then again on a new connection, it stays set, since the
// first copy may have been acted on.
func Track(ctx context.Context) (context.Context, *Written) {
	w := new(Written)
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				w.b.Store(true)
			}
		},
	}), w
}

// Load reports whether a request has been written in full since Track or the last
// Reset. For a request that got no answer, false means it was not sent (the server
// cannot have acted on it), true that its outcome is unknown.
func (w *Written) Load() bool { return w.b.Load() }

// Reset forgets a request written before: for a caller that sends another request with
// the same context after the first one's answer (a resend with a fresh token).
func (w *Written) Reset() { w.b.Store(false) }

// Describe is the text of an error for a request that got no answer: op, then "not
// sent" or "sent, no answer" according to sent, then the cause.
func Describe(op string, sent bool, cause error) string {
	state := "not sent"
	if sent {
		state = "sent, no answer"
	}
	return fmt.Sprintf("%s: %s: %v", op, state, cause)
}

// ReadLimited reads r to its end, but no more than limit bytes: over is true when r had
// more (data then holds limit+1 bytes, and the answer must not be used). err is the
// read's error, if any.
func ReadLimited(r io.Reader, limit int64) (data []byte, over bool, err error) {
	data, err = io.ReadAll(io.LimitReader(r, limit+1))
	return data, err == nil && int64(len(data)) > limit, err
}

// ParseRetryAfter reads a Retry-After header value (RFC 9110 §10.2.3) received at now:
// delay-seconds ("120") or an HTTP-date. It returns 0 for an empty, invalid or past
// value, and at most limit (a value too large to parse included).
func ParseRetryAfter(v string, now time.Time, limit time.Duration) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if strings.Trim(v, "0123456789") == "" {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > int64(limit/time.Second) {
			return limit // all digits, so only too large to parse
		}
		d = time.Duration(secs) * time.Second
	} else {
		at, err := http.ParseTime(v)
		if err != nil {
			return 0
		}
		d = at.Sub(now)
	}
	return min(max(d, 0), limit)
}
