package httpeffect_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/idempotency/httpeffect"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// Markers that must never show in an error, a result or the ledger: the request body,
// the answers' bodies, a credential in the URL's query and in a header.
const (
	reqSecret    = "REQ-SECRET-4111111111111111"
	respSecret   = "RESP-SECRET-jane.doe@example.com"
	urlSecret    = "URL-SECRET-apikey"
	headerSecret = "HEADER-SECRET-token"
)

var requestBody = []byte(`{"invoice":"INV-1","amountCents":1999,"card":"` + reqSecret + `"}`)

// clean fails if err's text holds any secret marker.
func clean(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	for _, s := range []string{reqSecret, respSecret, urlSecret, headerSecret, "/charges", "api_key"} {
		assert.NotContains(t, err.Error(), s)
	}
}

// received is a request as the provider saw it.
type received struct {
	method, uri string
	header      http.Header
	body        []byte
}

// provider is an httptest server answering with answer, recording every request.
type provider struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []received
	answer func(w http.ResponseWriter, r *http.Request)
}

func newProvider(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *provider {
	t.Helper()
	p := &provider{answer: answer}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.got = append(p.got, received{r.Method, r.RequestURI, r.Header.Clone(), body})
		answer := p.answer
		p.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) requests() []received {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]received(nil), p.got...)
}

func reply(status int, header map[string]string, body string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

type charge struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// decodeCharge reads the provider's charge; a "declined" charge is a decline.
func decodeCharge(_ int, _ http.Header, body []byte) (idempotency.Result, error) {
	var c charge
	if err := json.Unmarshal(body, &c); err != nil {
		return idempotency.Result{}, err
	}
	if c.Status == "declined" {
		return idempotency.Result{}, idempotency.Rejected("CARD_DECLINED", "card declined")
	}
	return idempotency.Result{ProviderRef: c.ID, Values: map[string]any{"chargeId": c.ID}}, nil
}

// rejectCard maps the provider's declines; every other 4xx is not a decline.
func rejectCard(status int, body []byte) (string, string, bool) {
	switch status {
	case http.StatusPaymentRequired:
		return "CARD_DECLINED", "card declined", true
	case http.StatusUnprocessableEntity:
		return "INVALID_CARD", "card number invalid", true
	}
	return "", "", false
}

// spec is a charge request to base, with a credential in the URL and in a header.
func spec(base string) httpeffect.Spec {
	return httpeffect.Spec{
		URL:    base + "/charges?api_key=" + urlSecret,
		Header: http.Header{"Authorization": {"Bearer " + headerSecret}},
		Body:   requestBody,
		Decode: decodeCharge,
		Reject: rejectCard,
		LookupURL: func(q idempotency.Query) string {
			return base + "/charges?api_key=" + urlSecret + "&idempotency_key=" + q.ProviderKey
		},
	}
}

func newEffect(t *testing.T, s httpeffect.Spec) idempotency.Effect {
	t.Helper()
	eff, err := httpeffect.New(s)
	require.NoError(t, err)
	return eff
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

// A 2xx is decoded into the result; the request carries the method, the body as given,
// the caller's headers, a JSON content type and the provider key in Idempotency-Key.
func TestDispatchConfirmed(t *testing.T) {
	p := newProvider(t, reply(http.StatusCreated, map[string]string{"Content-Type": "application/json"},
		`{"id":"ch_1","status":"succeeded","card_holder":"`+respSecret+`"}`))
	eff := newEffect(t, spec(p.srv.URL))
	res, err := eff.Dispatch(context.Background(), "pk-1")
	require.NoError(t, err)
	assert.Equal(t, idempotency.Result{ProviderRef: "ch_1", Values: map[string]any{"chargeId": "ch_1"}}, res)
	got := p.requests()
	require.Len(t, got, 1)
	assert.Equal(t, http.MethodPost, got[0].method)
	assert.Equal(t, "/charges?api_key="+urlSecret, got[0].uri)
	assert.Equal(t, "pk-1", got[0].header.Get("Idempotency-Key"))
	assert.Equal(t, "Bearer "+headerSecret, got[0].header.Get("Authorization"))
	assert.Equal(t, "application/json", got[0].header.Get("Content-Type"))
	assert.Equal(t, requestBody, got[0].body)

	// Another header name and method, and no Decode: an empty result.
	s := spec(p.srv.URL)
	s.KeyHeader, s.Method, s.Decode = "X-Request-Key", http.MethodPut, nil
	s.Header = http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	res, err = newEffect(t, s).Dispatch(context.Background(), "pk-2")
	require.NoError(t, err)
	assert.Equal(t, idempotency.Result{}, res)
	got = p.requests()
	assert.Equal(t, http.MethodPut, got[1].method)
	assert.Equal(t, "pk-2", got[1].header.Get("X-Request-Key"))
	assert.Empty(t, got[1].header.Get("Idempotency-Key"))
	assert.Equal(t, "application/x-www-form-urlencoded", got[1].header.Get("Content-Type"))
}

// A request that certainly did not leave is NotSent: a refused connection, a name that
// does not resolve, a context ended before sending. Its error names no URL or body.
func TestDispatchNotSent(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	p := newProvider(t, reply(http.StatusCreated, nil, `{"id":"ch_1"}`))
	for name, tc := range map[string]struct {
		base string
		ctx  context.Context
	}{
		"connection refused": {closedURL(t), context.Background()},
		"name not resolved":  {"http://no-such-provider.invalid", context.Background()},
		"context ended":      {p.srv.URL, cancelled},
	} {
		t.Run(name, func(t *testing.T) {
			s := spec(tc.base)
			s.Timeout = 10 * time.Second
			_, err := newEffect(t, s).Dispatch(tc.ctx, "pk-1")
			require.True(t, idempotency.IsNotSent(err), "%v", err)
			var te *httpeffect.TransportError
			require.ErrorAs(t, err, &te)
			assert.False(t, te.Sent)
			clean(t, err)
		})
	}
	assert.Empty(t, p.requests(), "nothing reached the provider")
}

// A 429 is NotSent, and its Retry-After (seconds or an HTTP date, capped) reaches the
// ledger through the error's RetryAfter method. It is never asked of Reject.
func TestDispatchThrottled(t *testing.T) {
	var asked atomic.Int32
	for name, tc := range map[string]struct {
		retryAfter string
		want       time.Duration
		slack      time.Duration
	}{
		"seconds":   {"7", 7 * time.Second, 0},
		"http date": {time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat), 90 * time.Second, 2 * time.Second},
		"none":      {"", 0, 0},
		"garbage":   {"soon", 0, 0},
		"too long":  {"999999999", httpeffect.MaxRetryAfter, 0},
	} {
		t.Run(name, func(t *testing.T) {
			p := newProvider(t, reply(http.StatusTooManyRequests, map[string]string{"Retry-After": tc.retryAfter}, respSecret))
			s := spec(p.srv.URL)
			s.Reject = func(int, []byte) (string, string, bool) { asked.Add(1); return "X", "x", true }
			_, err := newEffect(t, s).Dispatch(context.Background(), "pk-1")
			require.True(t, idempotency.IsNotSent(err), "%v", err)
			var ra interface{ RetryAfter() time.Duration }
			require.ErrorAs(t, err, &ra)
			assert.InDelta(t, tc.want, ra.RetryAfter(), float64(tc.slack))
			var se *httpeffect.StatusError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, http.StatusTooManyRequests, se.StatusCode)
			clean(t, err)
		})
	}
	assert.Zero(t, asked.Load())
}

// Chosen 4xx statuses are declines with the code Reject maps (and a 2xx the provider
// answers with a declined status is one too, through Decode); other 4xx are NotSent.
func TestDispatchRejected(t *testing.T) {
	for status, want := range map[int]*idempotency.Rejection{
		http.StatusPaymentRequired:     {Code: "CARD_DECLINED", Message: "card declined"},
		http.StatusUnprocessableEntity: {Code: "INVALID_CARD", Message: "card number invalid"},
	} {
		var body []byte
		p := newProvider(t, reply(status, nil, `{"error":"`+respSecret+`"}`))
		s := spec(p.srv.URL)
		s.Reject = func(st int, b []byte) (string, string, bool) { body = b; return rejectCard(st, b) }
		_, err := newEffect(t, s).Dispatch(context.Background(), "pk-1")
		var rej *idempotency.Rejection
		require.ErrorAs(t, err, &rej, "%d", status)
		assert.Equal(t, want, rej)
		assert.False(t, idempotency.IsNotSent(err))
		assert.Equal(t, `{"error":"`+respSecret+`"}`, string(body), "Reject sees the answer's body")
	}

	for _, status := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusNotFound, http.StatusConflict} {
		p := newProvider(t, reply(status, nil, respSecret))
		_, err := newEffect(t, spec(p.srv.URL)).Dispatch(context.Background(), "pk-1")
		require.True(t, idempotency.IsNotSent(err), "%d: %v", status, err)
		var se *httpeffect.StatusError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, status, se.StatusCode)
		assert.Zero(t, se.RetryAfter())
		clean(t, err)
	}

	// Without Reject, no status is a decline.
	p := newProvider(t, reply(http.StatusPaymentRequired, nil, ""))
	s := spec(p.srv.URL)
	s.Reject = nil
	_, err := newEffect(t, s).Dispatch(context.Background(), "pk-1")
	assert.True(t, idempotency.IsNotSent(err))

	// A decline in a 2xx, through Decode.
	p = newProvider(t, reply(http.StatusOK, nil, `{"id":"ch_9","status":"declined"}`))
	_, err = newEffect(t, spec(p.srv.URL)).Dispatch(context.Background(), "pk-1")
	var rej *idempotency.Rejection
	require.ErrorAs(t, err, &rej)
	assert.Equal(t, "CARD_DECLINED", rej.Code)
}

// What may have taken effect is an unknown outcome, a plain error: a 5xx (never asked of
// Reject), a timeout or a connection lost after the request was written, a 2xx that
// cannot be decoded or is too large, a redirect (not followed).
func TestDispatchUnknown(t *testing.T) {
	check := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		assert.False(t, idempotency.IsNotSent(err), "%v", err)
		var rej *idempotency.Rejection
		assert.False(t, errors.As(err, &rej))
		clean(t, err)
	}
	for _, status := range []int{500, 502, 503, 504} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			p := newProvider(t, reply(status, map[string]string{"Retry-After": "3"}, `{"error":"`+respSecret+`"}`))
			s := spec(p.srv.URL)
			s.Reject = func(int, []byte) (string, string, bool) { t.Error("Reject asked about a 5xx"); return "X", "", true }
			_, err := newEffect(t, s).Dispatch(context.Background(), "pk-1")
			check(t, err)
			var se *httpeffect.StatusError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, status, se.StatusCode)
		})
	}
	t.Run("timeout after the request was written", func(t *testing.T) {
		p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		})
		s := spec(p.srv.URL)
		s.Timeout = 200 * time.Millisecond
		_, err := newEffect(t, s).Dispatch(context.Background(), "pk-1")
		check(t, err)
		var te *httpeffect.TransportError
		require.ErrorAs(t, err, &te)
		assert.True(t, te.Sent)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Len(t, p.requests(), 1, "the provider got it")
	})
	t.Run("connection closed without an answer", func(t *testing.T) {
		p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		})
		_, err := newEffect(t, spec(p.srv.URL)).Dispatch(context.Background(), "pk-1")
		check(t, err)
		var te *httpeffect.TransportError
		require.ErrorAs(t, err, &te)
		assert.True(t, te.Sent)
	})
	t.Run("2xx that does not decode", func(t *testing.T) {
		p := newProvider(t, reply(http.StatusCreated, nil, `{"id": `+respSecret))
		_, err := newEffect(t, spec(p.srv.URL)).Dispatch(context.Background(), "pk-1")
		check(t, err)
		var de *httpeffect.DecodeError
		require.ErrorAs(t, err, &de)
		assert.Equal(t, http.StatusCreated, de.StatusCode)
		var syntax *json.SyntaxError
		assert.ErrorAs(t, err, &syntax, "the cause is kept for errors.As")
	})
	t.Run("2xx too large", func(t *testing.T) {
		p := newProvider(t, reply(http.StatusOK, nil, `{"id":"ch_1","pad":"`+strings.Repeat(respSecret, 100)+`"}`))
		s := spec(p.srv.URL)
		s.MaxResponseBytes = 256
		_, err := newEffect(t, s).Dispatch(context.Background(), "pk-1")
		check(t, err)
		assert.ErrorContains(t, err, "larger than 256 bytes")
	})
	t.Run("redirect not followed", func(t *testing.T) {
		p := newProvider(t, reply(http.StatusSeeOther, map[string]string{"Location": "/elsewhere"}, ""))
		_, err := newEffect(t, spec(p.srv.URL)).Dispatch(context.Background(), "pk-1")
		check(t, err)
		var se *httpeffect.StatusError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, http.StatusSeeOther, se.StatusCode)
		assert.Len(t, p.requests(), 1, "no GET to the redirect target")
	})
}

// Reconcile GETs the lookup URL (with the caller's headers, without a body or the key
// header): 200 is Found (decoded, or a decline), 404 NotFound, anything else
// StillUnknown; a lookup that got no answer is an error for the ledger to count.
func TestReconcile(t *testing.T) {
	p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("idempotency_key") {
		case "pk-known":
			_, _ = io.WriteString(w, `{"id":"ch_1","status":"succeeded","holder":"`+respSecret+`"}`)
		case "pk-declined":
			_, _ = io.WriteString(w, `{"id":"ch_2","status":"declined"}`)
		case "pk-garbled":
			_, _ = io.WriteString(w, `{"id":`)
		case "pk-pending":
			w.WriteHeader(http.StatusAccepted)
		case "pk-error":
			w.WriteHeader(http.StatusInternalServerError)
		case "pk-throttled":
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"code":"resource_missing"}}`)
		}
	})
	eff := newEffect(t, spec(p.srv.URL))
	ctx := context.Background()
	for key, want := range map[string]idempotency.Reconciliation{
		"pk-known":     idempotency.Found(idempotency.Result{ProviderRef: "ch_1", Values: map[string]any{"chargeId": "ch_1"}}),
		"pk-declined":  idempotency.ReconciledRejected("CARD_DECLINED", "card declined"),
		"pk-unknown":   idempotency.Absent(),
		"pk-garbled":   idempotency.StillUnknown("lookup answered 200, and Decode failed (*json.SyntaxError)"),
		"pk-pending":   idempotency.StillUnknown("lookup answered 202"),
		"pk-error":     idempotency.StillUnknown("lookup answered 500"),
		"pk-throttled": idempotency.StillUnknown("lookup answered 429"),
	} {
		rec, err := eff.Reconcile(ctx, idempotency.Query{Scope: "payment.collect", Key: "k", ProviderKey: key})
		require.NoError(t, err, key)
		assert.Equal(t, want, rec, key)
	}
	for _, r := range p.requests() {
		assert.Equal(t, http.MethodGet, r.method)
		assert.True(t, strings.HasPrefix(r.uri, "/charges?api_key="+urlSecret+"&idempotency_key=pk-"), r.uri)
		assert.Equal(t, "Bearer "+headerSecret, r.header.Get("Authorization"))
		assert.Empty(t, r.header.Get("Idempotency-Key"))
		assert.Empty(t, r.body)
	}

	// LookupAbsent confirms a 404 from its body: a 404 from a wrong path is not "not found".
	s := spec(p.srv.URL)
	s.LookupAbsent = func(body []byte) bool { return strings.Contains(string(body), `"resource_missing"`) }
	rec, err := newEffect(t, s).Reconcile(ctx, idempotency.Query{ProviderKey: "pk-unknown"})
	require.NoError(t, err)
	assert.Equal(t, idempotency.Absent(), rec)
	wrong := newProvider(t, reply(http.StatusNotFound, map[string]string{"Content-Type": "text/html"}, "<h1>Not Found</h1>"))
	s = spec(wrong.srv.URL)
	s.LookupAbsent = func(body []byte) bool { return strings.Contains(string(body), `"resource_missing"`) }
	rec, err = newEffect(t, s).Reconcile(ctx, idempotency.Query{ProviderKey: "pk-unknown"})
	require.NoError(t, err)
	assert.Equal(t, idempotency.StillUnknown("lookup answered 404 without the provider's not-found answer (Spec.LookupAbsent)"), rec)

	// No answer: an error (the ledger counts it as still unknown unless the attempt ended).
	_, err = newEffect(t, spec(closedURL(t))).Reconcile(ctx, idempotency.Query{ProviderKey: "pk-known"})
	var te *httpeffect.TransportError
	require.ErrorAs(t, err, &te)
	assert.Contains(t, te.Op, "lookup")
	clean(t, err)

	// No LookupURL: no Reconcile, and an unknown intent goes to an operator.
	s = spec(p.srv.URL)
	s.LookupURL = nil
	assert.Nil(t, newEffect(t, s).Reconcile)
}

// New refuses a spec it cannot send, naming the field and not the URL.
func TestNewValidates(t *testing.T) {
	for _, s := range []httpeffect.Spec{
		{},
		{URL: "://" + urlSecret},
		{URL: "ftp://pay.example/" + urlSecret},
		{URL: "/charges?api_key=" + urlSecret},
		{URL: "https://pay.example", Timeout: -1},
		{URL: "https://pay.example", MaxResponseBytes: -1},
	} {
		_, err := httpeffect.New(s)
		require.Error(t, err, "%+v", s)
		assert.Contains(t, err.Error(), "httpeffect: Spec.")
		clean(t, err)
	}
}

// Through the ledger: confirmed, declined, throttled, and unknown then reconciled
// intents leave no request body, answer body or credential in the ledger's rows or its
// trail, only the digest, the provider's reference, the mapped decline and status codes.
func TestBodiesNeverStored(t *testing.T) {
	pool := testenv.DB(t)
	db := stdlib.OpenDBFromPool(pool)
	_, err := migrations.Up(context.Background(), db)
	require.NoError(t, db.Close())
	require.NoError(t, err)
	ns := testenv.Unique("ns")
	l, err := idempotency.New(pool, idempotency.Config{Namespace: ns, ReconcileBackoff: time.Millisecond})
	require.NoError(t, err)
	ctx := testenv.Context(t, time.Minute)

	var mu sync.Mutex
	answers := map[string]func(http.ResponseWriter, *http.Request){} // by Idempotency-Key
	effects := map[string]bool{}
	p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if k := r.URL.Query().Get("idempotency_key"); k != "" { // a lookup
			if effects[k] {
				_, _ = io.WriteString(w, `{"id":"ch_`+k[len(k)-4:]+`","status":"succeeded","holder":"`+respSecret+`"}`)
				return
			}
			w.WriteHeader(http.StatusNotFound)
			return
		}
		k := r.Header.Get("Idempotency-Key")
		answers[k](w, r)
	})
	do := func(key string, answer func(http.ResponseWriter, *http.Request)) (idempotency.Receipt, error) {
		in := idempotency.Intent{Scope: "payment.collect", Key: key,
			Request: map[string]any{"invoice": key, "card": reqSecret}, Amount: 1999,
			Task: idempotency.TaskRef{Actor: "w", TaskID: "t-" + key, ProcessInstanceID: "pi", BusinessKey: key}}
		pk := idempotency.ProviderKey(ns, in.Scope, in.Key)
		mu.Lock()
		answers[pk] = answer
		mu.Unlock()
		return l.Do(ctx, in, newEffect(t, spec(p.srv.URL)))
	}
	ok := func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("Idempotency-Key")
		effects[k] = true
		_, _ = io.WriteString(w, `{"id":"ch_`+k[len(k)-4:]+`","status":"succeeded","holder":"`+respSecret+`"}`)
	}

	out, err := do("INV-ok", ok)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, out.State)

	_, err = do("INV-declined", reply(http.StatusPaymentRequired, nil, `{"error":"`+respSecret+`"}`))
	require.Error(t, err)
	clean(t, err)

	_, err = do("INV-throttled", reply(http.StatusTooManyRequests, map[string]string{"Retry-After": "1"}, respSecret))
	require.Error(t, err)
	clean(t, err)

	// A 500 after the provider acted: unknown, then reconciled by the lookup, not resent.
	_, err = do("INV-unknown", func(w http.ResponseWriter, r *http.Request) {
		effects[r.Header.Get("Idempotency-Key")] = true
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"trace":"`+respSecret+`"}`)
	})
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	clean(t, err)
	out, err = do("INV-unknown", func(w http.ResponseWriter, r *http.Request) { t.Error("an unknown intent was sent again") })
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateReconciled, out.State)

	var rows []string
	r, err := pool.Query(ctx, `SELECT row_to_json(i)::text FROM extworker_intents i WHERE namespace = $1
		UNION ALL SELECT row_to_json(e)::text FROM extworker_intent_events e JOIN extworker_intents i ON i.id = e.intent_id WHERE i.namespace = $1`, ns)
	require.NoError(t, err)
	for r.Next() {
		var s string
		require.NoError(t, r.Scan(&s))
		rows = append(rows, s)
	}
	require.NoError(t, r.Err())
	require.GreaterOrEqual(t, len(rows), 8)
	all := strings.Join(rows, "\n")
	for _, s := range []string{reqSecret, respSecret, urlSecret, headerSecret, "api_key"} {
		assert.NotContains(t, all, s)
	}
	for _, s := range []string{`"error_code":"CARD_DECLINED"`, `"error_message":"card declined"`, "status 429", "status 500"} {
		assert.Contains(t, all, s)
	}
}

// A charge: the Effect sends the request with the provider key and reads the answer; in a
// handler it goes to the ledger with the task's intent:
//
//	out, err := ledger.Do(ctx, task.Intent("payment.collect", "invoice:"+inv+":v1", req), eff)
func ExampleNew() {
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // the lookup
			w.WriteHeader(http.StatusNotFound)
			return
		}
		fmt.Println("provider got key", r.Header.Get("Idempotency-Key"))
		_, _ = io.WriteString(w, `{"id":"ch_1"}`)
	}))
	defer provider.Close()

	body, _ := json.Marshal(map[string]any{"invoice": "INV-1", "amountCents": 1999})
	eff, err := httpeffect.New(httpeffect.Spec{
		URL:    provider.URL + "/charges",
		Header: http.Header{"Authorization": {"Bearer ..."}},
		Body:   body,
		Decode: func(_ int, _ http.Header, body []byte) (idempotency.Result, error) {
			var c struct{ ID string }
			if err := json.Unmarshal(body, &c); err != nil {
				return idempotency.Result{}, err
			}
			return idempotency.Result{ProviderRef: c.ID, Values: map[string]any{"paymentRef": c.ID}}, nil
		},
		Reject: func(status int, _ []byte) (string, string, bool) {
			return "CARD_DECLINED", "card declined", status == http.StatusPaymentRequired
		},
		LookupURL: func(q idempotency.Query) string {
			return provider.URL + "/charges?idempotency_key=" + q.ProviderKey
		},
	})
	if err != nil {
		panic(err)
	}
	// What the ledger does with it:
	res, err := eff.Dispatch(context.Background(), "pk-example")
	fmt.Println(res.ProviderRef, err)
	rec, err := eff.Reconcile(context.Background(), idempotency.Query{ProviderKey: "pk-other"})
	fmt.Println(reflect.DeepEqual(rec, idempotency.Absent()), err)
	// Output:
	// provider got key pk-example
	// ch_1 <nil>
	// true <nil>
}
