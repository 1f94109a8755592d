package fakeprovider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"
)

// Client errors.
var (
	// ErrNotSent: the request certainly did not reach the provider, or the provider
	// certainly did nothing with it.
	ErrNotSent = errors.New("fakeprovider: request not sent")
	// ErrUnknownOutcome: the request left and no usable answer came back (a dropped
	// connection, or a 5xx): it may or may not have taken effect.
	ErrUnknownOutcome = errors.New("fakeprovider: unknown outcome")
	// ErrNotFound: a lookup found no charge for the key.
	ErrNotFound = errors.New("fakeprovider: no charge for this key")
	// ErrKeyMismatch: the key was first used with a different request (400
	// idempotency_error, 422 or 409 idempotency_key_mismatch, by dialect). Permanent:
	// retrying with the same key can never succeed.
	ErrKeyMismatch = errors.New("fakeprovider: idempotency key reused with a different request")
	// ErrSearchUnavailable: the provider offers no business-key search (501).
	ErrSearchUnavailable = errors.New("fakeprovider: search unavailable")
)

// RateLimitError is a 429: nothing was done; come back after After. It matches ErrNotSent.
type RateLimitError struct{ After time.Duration }

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("rate limited (429), retry after %v", e.After)
}

// Is matches ErrNotSent: the provider did nothing.
func (e *RateLimitError) Is(target error) bool { return target == ErrNotSent }

// RetryAfter is how long the provider asked to wait.
func (e *RateLimitError) RetryAfter() time.Duration { return e.After }

// InUseError is a 409 for a key whose first request is still in flight: this request
// did nothing, but the first one may still commit. Retry later with the same key. It
// matches ErrNotSent.
type InUseError struct {
	Code  string        // idempotency_key_in_use, or "" when the dialect gives none
	After time.Duration // Retry-After, if the provider sent one
}

func (e *InUseError) Error() string {
	return "idempotency key in use (409): the first request is still in flight"
}

// Is matches ErrNotSent: this request did nothing.
func (e *InUseError) Is(target error) bool { return target == ErrNotSent }

// RetryAfter is how long to wait before retrying: the provider's Retry-After, 1s if
// it sent none.
func (e *InUseError) RetryAfter() time.Duration {
	if e.After > 0 {
		return e.After
	}
	return time.Second
}

// StoredFailureError is what a lookup finds under a key whose stored answer is a
// failure (a stored 500, stripe dialect): no effect was made under the key, and a
// request with it only ever replays that failure until the key expires.
type StoredFailureError struct{ Status int }

func (e *StoredFailureError) Error() string {
	return fmt.Sprintf("fakeprovider: the key holds a stored failure (status %d): no effect, a same-key request replays it", e.Status)
}

// DeclineError is a definitive decline.
type DeclineError struct{ Code, Message string }

func (e *DeclineError) Error() string { return "declined: " + e.Code + ": " + e.Message }

// Client charges through a provider.
type Client struct {
	BaseURL string
	HTTP    *http.Client // http.DefaultClient if nil
}

// Charge charges an invoice once per idempotency key.
func (c *Client) Charge(ctx context.Context, key, invoice string, amountCents int64) (Charge, error) {
	body, _ := json.Marshal(chargeRequest{Invoice: invoice, AmountCents: amountCents})
	var ch Charge
	err := c.call(ctx, http.MethodPost, "/v1/charges", key, body, &ch)
	return ch, err
}

// Lookup finds the charge made with an idempotency key: ErrNotFound if the provider
// keeps nothing under it, *DeclineError for a stored decline, *StoredFailureError for a
// stored 500, *InUseError while a request with it is in flight.
func (c *Client) Lookup(ctx context.Context, key string) (Charge, error) {
	var ch Charge
	err := c.call(ctx, http.MethodGet, "/v1/charges?idempotency_key="+url.QueryEscape(key), "", nil, &ch)
	return ch, err
}

// Search finds an invoice's charges by business key, as far as the provider's search
// index has caught up (see Options.SearchLag); ErrSearchUnavailable if the provider has
// no search.
func (c *Client) Search(ctx context.Context, invoice string) ([]Charge, error) {
	var res struct {
		Data []Charge `json:"data"`
	}
	err := c.call(ctx, http.MethodGet, "/v1/charges/search?invoice="+url.QueryEscape(invoice), "", nil, &res)
	return res.Data, err
}

// Email sends a templated email about an invoice, once per idempotency key when the
// provider dedupes emails (an empty key sends without one).
func (c *Client) Email(ctx context.Context, key, invoice, to, template string) (Email, error) {
	body, _ := json.Marshal(emailRequest{To: to, Template: template, Invoice: invoice})
	var e Email
	if err := c.call(ctx, http.MethodPost, "/v1/emails", key, body, &e); err != nil {
		return Email{}, err
	}
	e.To = to // the provider never echoes the address
	return e, nil
}

// call sends one request and decodes a 200 into out; any other answer becomes an error.
func (c *Client) call(ctx context.Context, method, path, key string, body []byte, out any) error {
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			wrote.Store(true)
		}
	}})
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotSent, err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if wrote.Load() {
			return fmt.Errorf("%w: %v", ErrUnknownOutcome, err)
		}
		return fmt.Errorf("%w: %v", ErrNotSent, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%w: read answer: %v", ErrUnknownOutcome, err)
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%w: unreadable answer", ErrUnknownOutcome)
		}
		return nil
	}
	return classify(method, resp, data)
}

// apiErrorBody reads both error shapes: the provider's {"error":{type,code,message}}
// and an RFC 9457 problem {type,title,status,code}.
type apiErrorBody struct {
	Error struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Type  string `json:"type"`
	Title string `json:"title"`
	Code  string `json:"code"`
}

func (b apiErrorBody) code() string {
	if b.Error.Code != "" {
		return b.Error.Code
	}
	return b.Code
}

func (b apiErrorBody) typ() string {
	if b.Error.Type != "" {
		return b.Error.Type
	}
	return b.Type
}

// classify turns an answer other than 200 into an error, in one place.
func classify(method string, resp *http.Response, data []byte) error {
	var b apiErrorBody
	_ = json.Unmarshal(data, &b)
	st := resp.StatusCode
	switch {
	case st == http.StatusPaymentRequired:
		return &DeclineError{Code: b.code(), Message: b.Error.Message}
	case st == http.StatusNotFound && method == http.MethodGet:
		return ErrNotFound
	case st == http.StatusConflict && b.code() == codeMismatch,
		st == http.StatusUnprocessableEntity,
		st == http.StatusBadRequest && (b.typ() == typeIdemErr || b.code() == typeIdemErr):
		return fmt.Errorf("%w (status %d)", ErrKeyMismatch, st)
	case st == http.StatusConflict:
		return &InUseError{Code: b.code(), After: retryAfter(resp)}
	case st == http.StatusTooManyRequests:
		return &RateLimitError{After: retryAfter(resp)}
	case st == http.StatusNotImplemented && method == http.MethodGet:
		return ErrSearchUnavailable
	case st >= 500 && method == http.MethodGet && resp.Header.Get("Idempotent-Replayed") == "true":
		return &StoredFailureError{Status: st}
	case st >= 500:
		return fmt.Errorf("%w: status %d", ErrUnknownOutcome, st)
	}
	return fmt.Errorf("fakeprovider: status %d: %.200s", st, data)
}

func retryAfter(resp *http.Response) time.Duration {
	secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	return time.Duration(secs) * time.Second
}
