package httpeffect

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/idempotency"
)

// The decisions of an effect, each a function of values: no provider, no server.

var at = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func decodeID(_ int, _ http.Header, body []byte) (idempotency.Result, error) {
	var v struct{ ID, Status string }
	if err := json.Unmarshal(body, &v); err != nil {
		return idempotency.Result{}, err
	}
	if v.Status == "declined" {
		return idempotency.Result{}, idempotency.Rejected("CARD_DECLINED", "card declined")
	}
	return idempotency.Result{ProviderRef: v.ID}, nil
}

func reject402(status int, _ []byte) (string, string, bool) {
	return "CARD_DECLINED", "card declined", status == http.StatusPaymentRequired
}

func ans(status int, body string, kv ...string) answer {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return answer{status: status, header: h, at: at, body: []byte(body)}
}

// dispatchOutcome: 2xx decoded (or declined), 429 and other 4xx NotSent, a mapped 4xx a
// decline, 5xx, 3xx and unreadable 2xx an unknown outcome; Retry-After on 429 and 503.
func TestDispatchOutcomeDecision(t *testing.T) {
	s := Spec{Name: "pay charge", Decode: decodeID, Reject: reject402}
	unreadable := ans(200, `{"id"`)
	unreadable.readErr = io.ErrUnexpectedEOF
	type want struct {
		result     idempotency.Result
		notSent    bool
		rejected   string // the decline's code
		unknown    bool   // an error neither NotSent nor a decline
		retryAfter time.Duration
	}
	for name, tc := range map[string]struct {
		s    Spec
		a    answer
		want want
	}{
		"201 decoded":               {s, ans(201, `{"id":"ch_1"}`), want{result: idempotency.Result{ProviderRef: "ch_1"}}},
		"200 without Decode":        {Spec{Name: "x"}, ans(200, `garbage`), want{}},
		"200 declined in the body":  {s, ans(200, `{"id":"ch_1","status":"declined"}`), want{rejected: "CARD_DECLINED"}},
		"200 that does not decode":  {s, ans(200, `{"id":`), want{unknown: true}},
		"200 unreadable":            {s, unreadable, want{unknown: true}},
		"429 with seconds":          {s, ans(429, ``, "Retry-After", "7"), want{notSent: true, retryAfter: 7 * time.Second}},
		"429 with a date":           {s, ans(429, ``, "Retry-After", at.Add(90*time.Second).Format(http.TimeFormat)), want{notSent: true, retryAfter: 90 * time.Second}},
		"429 capped":                {s, ans(429, ``, "Retry-After", "99999999"), want{notSent: true, retryAfter: MaxRetryAfter}},
		"402 mapped by Reject":      {s, ans(402, `{}`), want{rejected: "CARD_DECLINED"}},
		"402 without Reject":        {Spec{Name: "x"}, ans(402, `{}`), want{notSent: true}},
		"409 not mapped":            {s, ans(409, `{}`), want{notSent: true}},
		"500":                       {s, ans(500, `{}`, "Retry-After", "3"), want{unknown: true}},
		"503 with Retry-After":      {s, ans(503, ``, "Retry-After", "3"), want{unknown: true, retryAfter: 3 * time.Second}},
		"303 redirect not followed": {s, ans(303, ``, "Location", "/elsewhere"), want{unknown: true}},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := dispatchOutcome(tc.s, tc.a)
			assert.Equal(t, tc.want.result, r)
			var rej *idempotency.Rejection
			switch {
			case tc.want.rejected != "":
				require.ErrorAs(t, err, &rej)
				assert.Equal(t, tc.want.rejected, rej.Code)
				assert.False(t, idempotency.IsNotSent(err))
			case tc.want.notSent:
				assert.True(t, idempotency.IsNotSent(err), "%v", err)
			case tc.want.unknown:
				require.Error(t, err)
				assert.False(t, idempotency.IsNotSent(err), "%v", err)
				assert.False(t, errors.As(err, &rej))
			default:
				require.NoError(t, err)
			}
			var ra interface{ RetryAfter() time.Duration }
			if errors.As(err, &ra) {
				assert.Equal(t, tc.want.retryAfter, ra.RetryAfter())
			} else {
				assert.Zero(t, tc.want.retryAfter)
			}
		})
	}
}

// A request that got no answer is NotSent unless it was written in full.
func TestNoAnswerDecision(t *testing.T) {
	notWritten := &TransportError{Op: "pay charge", Err: errors.New("connection refused")}
	err := noAnswer(notWritten)
	assert.True(t, idempotency.IsNotSent(err))
	assert.ErrorIs(t, err, notWritten)
	assert.EqualError(t, notWritten, "httpeffect: pay charge: not sent: connection refused")

	written := &TransportError{Op: "pay charge", Sent: true, Err: errors.New("connection reset by peer")}
	err = noAnswer(written)
	assert.False(t, idempotency.IsNotSent(err), "an unknown outcome")
	assert.Same(t, written, err)
	assert.EqualError(t, written, "httpeffect: pay charge: sent, no answer: connection reset by peer")
}

// lookupOutcome: 200 Found (decoded, or a decline), 404 Absent unless LookupAbsent
// disagrees, anything else or an unreadable answer StillUnknown.
func TestLookupOutcomeDecision(t *testing.T) {
	s := Spec{Name: "pay charge", Decode: decodeID}
	strict := s
	strict.LookupAbsent = func(body []byte) bool { return string(body) == `{"error":"no_such_key"}` }
	unreadable := ans(200, `{"id"`)
	unreadable.readErr = io.ErrUnexpectedEOF
	for name, tc := range map[string]struct {
		s    Spec
		a    answer
		want idempotency.Reconciliation
	}{
		"200 found":                   {s, ans(200, `{"id":"ch_1"}`), idempotency.Found(idempotency.Result{ProviderRef: "ch_1"})},
		"200 without Decode":          {Spec{}, ans(200, `garbage`), idempotency.Found(idempotency.Result{})},
		"200 declined":                {s, ans(200, `{"id":"ch_1","status":"declined"}`), idempotency.ReconciledRejected("CARD_DECLINED", "card declined")},
		"200 that does not decode":    {s, ans(200, `{`), idempotency.StillUnknown("lookup answered 200, and Decode failed (*json.SyntaxError)")},
		"200 unreadable":              {s, unreadable, idempotency.StillUnknown("lookup answered 200, and its answer could not be read")},
		"404":                         {s, ans(404, ``), idempotency.Absent()},
		"404 confirmed":               {strict, ans(404, `{"error":"no_such_key"}`), idempotency.Absent()},
		"404 not the provider's":      {strict, ans(404, `<html>`), idempotency.StillUnknown("lookup answered 404 without the provider's not-found answer (Spec.LookupAbsent)")},
		"500":                         {s, ans(500, ``), idempotency.StillUnknown("lookup answered 500")},
		"202 is not a found":          {s, ans(202, `{"id":"ch_1"}`), idempotency.StillUnknown("lookup answered 202")},
		"429 is not an absent either": {s, ans(429, ``), idempotency.StillUnknown("lookup answered 429")},
	} {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, lookupOutcome(tc.s, tc.a))
		})
	}
}
