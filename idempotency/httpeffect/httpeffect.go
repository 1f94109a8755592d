// Package httpeffect builds an idempotency.Effect for the common provider shape: one
// HTTP request that carries the provider key in an Idempotency-Key header, and a lookup
// URL that tells whether the provider has a request under a key.
//
// New returns an Effect whose Dispatch sends the request and classifies the answer the
// way the ledger needs it:
//
//   - the request certainly did not leave (connection refused, a DNS failure, the
//     context ended before it was written in full): idempotency.NotSent, so the intent
//     goes back to prepared and the next attempt sends it again;
//   - 429 Too Many Requests: idempotency.NotSent, with the Retry-After delay (seconds or
//     an HTTP date, at most MaxRetryAfter) on the error's RetryAfter method, so the
//     task's retry waits at least that long;
//   - any other 4xx: Spec.Reject decides whether it is a definitive decline
//     (idempotency.Rejected with the code and message it maps: a declined card, an
//     unknown recipient); otherwise it is idempotency.NotSent too (a 4xx is a refusal,
//     not an effect);
//   - 2xx: Spec.Decode turns the answer into the result the ledger records (it may also
//     return idempotency.Rejected for a decline the provider answers with a 2xx);
//   - everything else, above all a 5xx, a timeout or a connection lost after the request
//     was written, a 2xx that cannot be decoded, a redirect (never followed): the outcome
//     is unknown, and the error is a plain one.
//
// A 5xx can only be retried safely with Reconcile or Search: the provider may have acted
// before failing, and the ledger never sends an unknown intent again until a lookup says
// the provider has no record of it. Spec.LookupURL gives the Effect the standard
// Reconcile, a GET of a URL that names the key: 200 is Found (decoded by Decode), 404 is
// Absent, anything else StillUnknown. Without LookupURL (or an Effect.Search the
// caller sets), an unknown intent goes to an operator (operator_hold, with an incident),
// who settles it by hand.
//
// With traces on (package extworker sets up OpenTelemetry from the OTEL_* variables),
// every request and lookup carries the W3C trace context (traceparent) of the ledger's
// "provider call" or "provider lookup" span, through the global propagator.
//
// Request bodies are never stored: the ledger keeps only the intent's digest, the
// Effect keeps Spec.Body only to send it, and no error of this package contains a
// request or response body, a URL's path or query, or a header value: only the method,
// the host, status codes and short reasons, since errors end up in the ledger's trail
// and the engine's incidents. Decode and Reject see the answer's body; what they return
// is recorded, so they should return only what belongs in the ledger.
package httpeffect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/transport"
)

// Defaults for Spec fields left zero.
const (
	DefaultKeyHeader        = "Idempotency-Key"
	DefaultTimeout          = 30 * time.Second
	DefaultMaxResponseBytes = 1 << 20
)

// MaxRetryAfter caps the delay a 429's Retry-After can ask for.
const MaxRetryAfter = time.Hour

// Spec describes the provider request of one effect and how to read its answers. Build
// one per intent: Body is the request of that intent.
type Spec struct {
	// Name names the call in errors, e.g. "pay.example charge". Default: the method and
	// the URL's host. Never put a secret or personal data in it.
	Name string
	// Client sends the requests. Default http.DefaultClient. Redirects are never followed
	// (a 3xx is an unknown outcome): a POST redirected by a 303 would turn into a GET.
	Client *http.Client
	// Method is the request's method. Default POST.
	Method string
	// URL is the request's URL, http or https. Required.
	URL string
	// Header is sent with the request and with lookups (credentials, Content-Type). The
	// key header is added to the request. Content-Type defaults to application/json when
	// there is a Body.
	Header http.Header
	// Body is the request's body, sent as it is.
	Body []byte
	// KeyHeader is the header that carries the provider key. Default Idempotency-Key.
	KeyHeader string
	// Timeout bounds each request and lookup, reading the answer included. Default 30s.
	// The ledger bounds a dispatch by the intent's lease as well, and refuses an effect
	// whose Timeout (Effect.Timeout) its lease cannot leave whole.
	Timeout time.Duration
	// MaxResponseBytes caps the answer body read. Default 1 MiB. A larger 2xx answer is
	// an unknown outcome (the provider acted; the answer cannot be read).
	MaxResponseBytes int64
	// Decode turns a 2xx answer (and a lookup's 200) into the result to record: the
	// provider's reference and the values the task completes with. It may return
	// idempotency.Rejected for a decline answered with a 2xx; any other error makes the
	// outcome unknown (its text is not printed: it may quote the body). Default: an
	// empty result.
	Decode func(status int, header http.Header, body []byte) (idempotency.Result, error)
	// Reject maps a 4xx answer other than 429 to a decline (ok true): its code and
	// message become the idempotency.Rejection, and by default the task's BPMN error. A
	// 4xx it does not map (or without Reject) is idempotency.NotSent. It is never asked
	// about a 5xx: a server error is never a decline.
	Reject func(status int, body []byte) (code, message string, ok bool)
	// LookupURL returns the URL that looks the effect up by its provider key
	// (q.ProviderKey), e.g. "https://pay.example/charges?idempotency_key=" +
	// url.QueryEscape(q.ProviderKey). Set, the Effect gets a Reconcile that GETs it (with
	// Header, without a body or the key header): 200 is Found, decoded by Decode; 404 is
	// Absent, which lets the ledger send the intent again under the same key, so the
	// URL must answer 404 only for a key the provider does not know (a wrong path answers
	// 404 too: see LookupAbsent); anything else is StillUnknown.
	LookupURL func(q idempotency.Query) string
	// LookupAbsent, if set, must confirm a lookup's 404 from its body (the provider's
	// own "no such key" answer) before it counts as Absent; a 404 it does not confirm
	// is StillUnknown.
	LookupAbsent func(body []byte) bool
}

// New returns the Effect for s, or what is wrong with s.
func New(s Spec) (idempotency.Effect, error) {
	u, err := url.Parse(s.URL)
	switch {
	case s.URL == "":
		return idempotency.Effect{}, errors.New("httpeffect: Spec.URL is required")
	case err != nil:
		return idempotency.Effect{}, errors.New("httpeffect: Spec.URL does not parse")
	case u.Scheme != "http" && u.Scheme != "https":
		return idempotency.Effect{}, errors.New("httpeffect: Spec.URL must be http or https")
	case u.Host == "":
		return idempotency.Effect{}, errors.New("httpeffect: Spec.URL has no host")
	case s.Timeout < 0 || s.MaxResponseBytes < 0:
		return idempotency.Effect{}, errors.New("httpeffect: Spec.Timeout and Spec.MaxResponseBytes must not be negative")
	}
	if s.Method == "" {
		s.Method = http.MethodPost
	}
	if s.KeyHeader == "" {
		s.KeyHeader = DefaultKeyHeader
	}
	if s.Timeout == 0 {
		s.Timeout = DefaultTimeout
	}
	if s.MaxResponseBytes == 0 {
		s.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if s.Name == "" {
		s.Name = s.Method + " " + u.Host
	}
	base := http.DefaultClient
	if s.Client != nil {
		base = s.Client
	}
	hc := *base
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	e := &effect{s: s, hc: &hc}
	eff := idempotency.Effect{Dispatch: e.dispatch, Timeout: s.Timeout} // the ledger checks its lease against it
	if s.LookupURL != nil {
		eff.Reconcile = e.reconcile
	}
	return eff, nil
}

type effect struct {
	s  Spec
	hc *http.Client
}

// answer is an HTTP answer read in full (up to MaxResponseBytes).
type answer struct {
	status  int
	header  http.Header
	at      time.Time // when it arrived: a Retry-After date counts from it
	body    []byte
	readErr error // the body could not be read, or was too large
}

// send performs one request, named op in errors. It returns the answer, or a
// *TransportError when none came: not sent unless the request had been written in full
// (internal/transport tracks it, as it does for the engine client).
func (e *effect) send(ctx context.Context, op, method, rawURL string, body []byte, key string) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, e.s.Timeout)
	defer cancel()
	ctx, written := transport.Track(ctx)
	req, err := e.request(ctx, method, rawURL, body, key)
	if err != nil {
		return answer{}, &TransportError{Op: op, Err: errors.New("the request could not be built")}
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return answer{}, &TransportError{Op: op, Sent: written.Load(), Err: stripURL(err)}
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header, at: time.Now()}
	var over bool
	a.body, over, a.readErr = transport.ReadLimited(resp.Body, e.s.MaxResponseBytes)
	switch {
	case a.readErr != nil:
		a.readErr = stripURL(a.readErr)
	case over:
		a.readErr = fmt.Errorf("answer larger than %d bytes (Spec.MaxResponseBytes)", e.s.MaxResponseBytes)
	}
	return a, nil
}

// request builds a request with the Spec's headers, a default JSON content type for a
// body, the provider key (key, unless empty) and the trace context.
func (e *effect) request(ctx context.Context, method, rawURL string, body []byte, key string) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, rawURL, rd)
	if err != nil {
		return nil, err
	}
	for k, vs := range e.s.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(e.s.KeyHeader, key)
	}
	// The trace context (W3C traceparent) of the ledger's "provider call" span, when
	// traces are on (the global propagator does nothing otherwise), so that the
	// provider's own traces join the task's.
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	return req, nil
}

func (e *effect) dispatch(ctx context.Context, providerKey string) (idempotency.Result, error) {
	a, err := e.send(ctx, e.s.Name, e.s.Method, e.s.URL, e.s.Body, providerKey)
	if err != nil {
		return idempotency.Result{}, noAnswer(err)
	}
	return dispatchOutcome(e.s, a)
}

// noAnswer is Dispatch's error for a request that got no answer: idempotency.NotSent
// unless the request had been written in full; then the outcome is unknown, and the
// error is returned as it is.
func noAnswer(err error) error {
	var te *TransportError
	if errors.As(err, &te) && !te.Sent {
		return idempotency.NotSent(err)
	}
	return err
}

// dispatchOutcome is what an answer to the request means for the ledger (see the package
// documentation): a result, a decline, NotSent, or an unknown outcome.
func dispatchOutcome(s Spec, a answer) (idempotency.Result, error) {
	switch st := a.status; {
	case st >= 200 && st < 300:
		if a.readErr != nil {
			return idempotency.Result{}, &DecodeError{Op: s.Name, StatusCode: st, Reason: "the answer could not be read: " + a.readErr.Error(), Err: a.readErr}
		}
		return decode(s, a)
	case st == http.StatusTooManyRequests:
		return idempotency.Result{}, idempotency.NotSent(&StatusError{Op: s.Name, StatusCode: st, Retry: retryAfter(a)})
	case st >= 400 && st < 500:
		if s.Reject != nil && a.readErr == nil {
			if code, msg, ok := s.Reject(st, a.body); ok {
				return idempotency.Result{}, idempotency.Rejected(code, msg)
			}
		}
		return idempotency.Result{}, idempotency.NotSent(&StatusError{Op: s.Name, StatusCode: st})
	case st == http.StatusServiceUnavailable:
		return idempotency.Result{}, &StatusError{Op: s.Name, StatusCode: st, Retry: retryAfter(a)}
	}
	return idempotency.Result{}, &StatusError{Op: s.Name, StatusCode: a.status}
}

// decode runs Decode on a 2xx answer; a decline passes as it is, any other failure is a
// *DecodeError (an unknown outcome).
func decode(s Spec, a answer) (idempotency.Result, error) {
	if s.Decode == nil {
		return idempotency.Result{}, nil
	}
	r, err := s.Decode(a.status, a.header, a.body)
	if err == nil {
		return r, nil
	}
	var rej *idempotency.Rejection
	if errors.As(err, &rej) {
		return idempotency.Result{}, rej
	}
	return idempotency.Result{}, &DecodeError{Op: s.Name, StatusCode: a.status, Reason: fmt.Sprintf("Decode failed (%T)", err), Err: err}
}

func (e *effect) reconcile(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
	a, err := e.send(ctx, e.s.Name+" lookup", http.MethodGet, e.s.LookupURL(q), nil, "")
	if err != nil {
		return idempotency.Reconciliation{}, err // the ledger counts it as StillUnknown, unless the attempt ended
	}
	return lookupOutcome(e.s, a), nil
}

// lookupOutcome is what a lookup's answer says of the effect: 200 Found (decoded by
// Decode, or a decline), 404 Absent (confirmed by LookupAbsent when set), anything
// else, or an answer that cannot be read, StillUnknown.
func lookupOutcome(s Spec, a answer) idempotency.Reconciliation {
	switch {
	case a.readErr != nil:
		return idempotency.StillUnknown(fmt.Sprintf("lookup answered %d, and its answer could not be read", a.status))
	case a.status == http.StatusOK:
		if s.Decode == nil {
			return idempotency.Found(idempotency.Result{})
		}
		r, err := s.Decode(a.status, a.header, a.body)
		var rej *idempotency.Rejection
		switch {
		case err == nil:
			return idempotency.Found(r)
		case errors.As(err, &rej):
			return idempotency.ReconciledRejected(rej.Code, rej.Message)
		}
		return idempotency.StillUnknown(fmt.Sprintf("lookup answered 200, and Decode failed (%T)", err))
	case a.status == http.StatusNotFound:
		if s.LookupAbsent != nil && !s.LookupAbsent(a.body) {
			return idempotency.StillUnknown("lookup answered 404 without the provider's not-found answer (Spec.LookupAbsent)")
		}
		return idempotency.Absent()
	}
	return idempotency.StillUnknown(fmt.Sprintf("lookup answered %d", a.status))
}

// retryAfter is the delay the answer's Retry-After header asks for, at most
// MaxRetryAfter.
func retryAfter(a answer) time.Duration {
	return transport.ParseRetryAfter(a.header.Get("Retry-After"), a.at, MaxRetryAfter)
}

// StatusError is an answer that is neither a success nor a decline. Dispatch returns it
// wrapped with idempotency.NotSent for a 4xx (429 included), as it is (an unknown
// outcome) otherwise.
type StatusError struct {
	Op         string // Spec.Name
	StatusCode int
	// Retry is the delay the Retry-After header of a 429 or 503 asked for, at most
	// MaxRetryAfter; zero without one.
	Retry time.Duration
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("httpeffect: %s: status %d", e.Op, e.StatusCode)
	if t := http.StatusText(e.StatusCode); t != "" {
		s += " " + t
	}
	if e.Retry > 0 {
		s += fmt.Sprintf(" (retry after %v)", e.Retry)
	}
	return s
}

// RetryAfter is the delay the provider asked for; the ledger waits at least that long
// before a NotSent intent's next attempt.
func (e *StatusError) RetryAfter() time.Duration { return e.Retry }

// TransportError is a request that got no answer. Sent tells whether the whole request
// had been written to a connection before the failure: if not, the provider cannot have
// acted on it ("not sent"), and Dispatch wraps the error with idempotency.NotSent; if it
// was ("sent, no answer"), the outcome is unknown. The tracking is internal/transport's,
// the same the engine client (camunda7.TransportError) uses.
type TransportError struct {
	Op   string // Spec.Name, plus " lookup" for a lookup
	Sent bool
	Err  error // the network error, without the URL
}

func (e *TransportError) Error() string {
	return "httpeffect: " + transport.Describe(e.Op, e.Sent, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// DecodeError is a 2xx answer that could not be read or decoded: the provider acted, and
// what it did is unknown until a lookup tells. Err is kept for errors.As but not printed:
// a decoding error can quote the body.
type DecodeError struct {
	Op         string
	StatusCode int
	Reason     string
	Err        error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("httpeffect: %s: status %d: %s", e.Op, e.StatusCode, e.Reason)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// stripURL drops the *url.Error wrapper, whose text holds the whole URL (a query may
// carry a key or personal data), keeping the network error it wraps.
func stripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
