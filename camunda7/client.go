package camunda7

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"

	"github.com/go-resty/resty/v2"

	"github.com/extworker/extworker/internal/transport"
)

// Defaults for Config fields left zero.
const (
	DefaultBaseURL          = "http://127.0.0.1:8080/engine-rest"
	DefaultTimeout          = 30 * time.Second
	DefaultLongPollMargin   = 10 * time.Second
	DefaultMaxResponseBytes = 32 << 20
	// MaxAsyncResponseTimeout is the longest long poll the engine accepts (30 minutes).
	MaxAsyncResponseTimeout = 30 * time.Minute
)

// TokenSource yields a bearer token for each request, for tokens that expire (OAuth2
// client credentials). An adapter for golang.org/x/oauth2 is one line:
//
//	camunda7.TokenSourceFunc(func(context.Context) (string, error) {
//		t, err := ts.Token()
//		if err != nil { return "", err }
//		return t.AccessToken, nil
//	})
type TokenSource interface {
	Token(ctx context.Context) (string, error)
}

// TokenInvalidator is implemented by a TokenSource that caches its tokens. When the engine
// answers 401 to a request carrying a token from such a source, the client calls
// InvalidateToken with that token, takes a fresh one from the source and sends the request
// once more; a second 401 is returned as ErrUnauthorized. The source should drop its
// cached token only if it is still the one passed (concurrent requests may all report the
// same rejected token, and the first of them may already have fetched a fresh one).
type TokenInvalidator interface {
	InvalidateToken(token string)
}

// TokenSourceFunc adapts a function to TokenSource.
type TokenSourceFunc func(ctx context.Context) (string, error)

// Token calls f.
func (f TokenSourceFunc) Token(ctx context.Context) (string, error) { return f(ctx) }

// Config configures a Client. The zero value talks to a local engine without auth.
type Config struct {
	// BaseURL is the REST API root including its path. Default DefaultBaseURL.
	BaseURL string
	// Username and Password enable HTTP basic auth when Username is set.
	Username string
	Password string
	// BearerToken is a static bearer token. Ignored when TokenSource is set.
	BearerToken string
	// TokenSource supplies a bearer token per request. If it implements TokenInvalidator,
	// a 401 answer invalidates the token and the request is sent once more with a new one.
	TokenSource TokenSource
	// AllowPlaintextAuth allows credentials (Username/Password, BearerToken, TokenSource)
	// over plain http:// to a host other than loopback (127.0.0.0/8, ::1, localhost), where
	// anyone on the path can read them. Without it, Validate refuses that configuration;
	// with it, New logs a warning.
	AllowPlaintextAuth bool
	// Headers are added to every request (e.g. a tenant or routing header).
	Headers map[string]string
	// TLS configures HTTPS: a custom CA pool, client certificates, server name. Nil uses
	// the system roots.
	TLS *tls.Config
	// Timeout bounds each ordinary request, including reading its answer. Default 30s.
	Timeout time.Duration
	// LongPollMargin is added to a fetchAndLock request's asyncResponseTimeout to get its
	// HTTP timeout, so the client never gives up on a long poll before the engine answers
	// (a poll the client abandons can still lock tasks that then sit locked until their
	// lock expires). Default 10s.
	LongPollMargin time.Duration
	// MaxResponseBytes caps the size of an answer body. Default 32 MiB.
	MaxResponseBytes int64
	// HTTPClient replaces the HTTP client (its Transport is used; its Timeout must be zero,
	// since timeouts come from the request context). Nil builds one from TLS.
	HTTPClient *http.Client
	// Logger receives debug records per request. Nil discards them.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.LongPollMargin == 0 {
		c.LongPollMargin = DefaultLongPollMargin
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c at once, each naming its field.
func (c Config) Validate() error {
	var errs []error
	u, err := url.Parse(c.BaseURL)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("BaseURL %q: %w", c.BaseURL, err))
	case u.Scheme != "http" && u.Scheme != "https":
		errs = append(errs, fmt.Errorf("BaseURL %q: scheme must be http or https", c.BaseURL))
	case u.Host == "":
		errs = append(errs, fmt.Errorf("BaseURL %q: no host", c.BaseURL))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout %v: must not be negative", c.Timeout))
	}
	if c.LongPollMargin < 0 {
		errs = append(errs, fmt.Errorf("LongPollMargin %v: must not be negative", c.LongPollMargin))
	}
	if c.MaxResponseBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxResponseBytes %d: must not be negative", c.MaxResponseBytes))
	}
	if c.Password != "" && c.Username == "" {
		errs = append(errs, errors.New("Password is set but Username is empty"))
	}
	if c.Username != "" && (c.BearerToken != "" || c.TokenSource != nil) {
		errs = append(errs, errors.New("Username and a bearer token (BearerToken or TokenSource) are both set: choose one"))
	}
	if err == nil && c.plaintextAuth(u) && !c.AllowPlaintextAuth {
		errs = append(errs, fmt.Errorf("BaseURL %q: %s over plain http would travel in clear to a host that is not loopback: "+
			"use https, or set AllowPlaintextAuth", u.Redacted(), c.credentials()))
	}
	if c.HTTPClient != nil && c.HTTPClient.Timeout != 0 {
		errs = append(errs, errors.New("HTTPClient.Timeout must be zero: timeouts come from Timeout and LongPollMargin"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("camunda7 config: %w", errors.Join(errs...))
	}
	return nil
}

// credentials names the credentials c sends, for messages; "" when none.
func (c Config) credentials() string {
	switch {
	case c.Username != "":
		return "basic auth (Username, Password)"
	case c.TokenSource != nil:
		return "the bearer token (TokenSource)"
	case c.BearerToken != "":
		return "the bearer token (BearerToken)"
	}
	return ""
}

// plaintextAuth reports whether c sends credentials over plain http to a host that is not
// loopback.
func (c Config) plaintextAuth(u *url.URL) bool {
	return c.credentials() != "" && u.Scheme == "http" && !isLoopbackHost(u.Hostname())
}

// isLoopbackHost reports whether host (no port, no brackets) is localhost or a loopback IP
// address: traffic to it does not leave the machine.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Client talks to one engine's REST API. It is safe for concurrent use.
type Client struct {
	cfg  Config
	rc   *resty.Client
	base string
	host string // the base URL's host and port, for traces
}

// New returns a Client for cfg (after WithDefaults), or the configuration's problems.
func New(cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hc := cfg.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 32
		if cfg.TLS != nil {
			tr.TLSClientConfig = cfg.TLS.Clone()
		}
		hc = &http.Client{Transport: tr}
	}
	base := strings.TrimRight(cfg.BaseURL, "/")
	rc := resty.NewWithClient(hc).
		SetBaseURL(base).
		SetDoNotParseResponse(true).
		SetDisableWarn(true). // its per-request basic-auth-over-HTTP warning; New warns once instead
		SetLogger(restyLogger{cfg.Logger}).
		SetHeader("Accept", "application/json")
	for k, v := range cfg.Headers {
		rc.SetHeader(k, v)
	}
	if cfg.Username != "" {
		rc.SetBasicAuth(cfg.Username, cfg.Password)
	}
	if u, err := url.Parse(cfg.BaseURL); err == nil && cfg.plaintextAuth(u) {
		// Validate refused it unless AllowPlaintextAuth is set.
		cfg.Logger.Warn(cfg.credentials()+" over plain HTTP travels in clear (AllowPlaintextAuth); use https",
			slog.String("base_url", u.Redacted()))
	}
	if cfg.BearerToken != "" && cfg.TokenSource == nil {
		rc.SetAuthToken(cfg.BearerToken)
	}
	host := ""
	if u, err := url.Parse(base); err == nil {
		host = u.Host
	}
	return &Client{cfg: cfg, rc: rc, base: base, host: host}, nil
}

// CloseIdleConnections closes kept-alive connections, e.g. before a process exits.
func (c *Client) CloseIdleConnections() { c.rc.GetClient().CloseIdleConnections() }

// BaseURL returns the REST API root the client talks to.
func (c *Client) BaseURL() string { return c.base }

// LongPollTimeout returns the HTTP timeout used for a fetchAndLock request with the given
// asyncResponseTimeout: always longer than the long poll, and never shorter than Timeout.
func (c *Client) LongPollTimeout(asyncResponseTimeout time.Duration) time.Duration {
	return max(asyncResponseTimeout+c.cfg.LongPollMargin, c.cfg.Timeout)
}

// call describes one request.
type call struct {
	op           string // "complete external task 42": the prefix of every error
	method, path string
	query        url.Values
	body         any // marshalled as JSON; a RawBody is sent as it is
	out          any // JSON answer target; *string takes a text/plain answer
	timeout      time.Duration
	taskEndpoint bool // the engine's "does not exist" means the task is gone; a lock message means the lock is lost
}

// RawBody is a request body that is not JSON (a multipart deployment), sent as it is.
type RawBody struct {
	ContentType string
	Data        []byte
}

// Request is one REST call of the engine that the Client's methods do not cover, for the
// packages built on the client (admin) and for an endpoint of your own. It goes through
// everything the methods do: authentication, timeouts, the response size limit, and the
// errors (*Error, *TransportError, *ResponseError) with their sentinels.
type Request struct {
	// Op says what the call does; it begins every error, e.g. "start process order".
	Op     string
	Method string
	// Path is below the base URL, its segments escaped: "/process-instance/" +
	// url.PathEscape(id).
	Path  string
	Query url.Values
	// Body is marshalled as JSON; a RawBody is sent as it is. Nil sends none.
	Body any
	// Out receives the JSON answer (a *string, a text/plain one). Nil ignores it.
	Out any
}

// Do sends r.
func (c *Client) Do(ctx context.Context, r Request) error {
	return c.do(ctx, call{op: r.Op, method: r.Method, path: r.Path, query: r.Query, body: r.Body, out: r.Out})
}

// InvalidArgument is the error of a call refused before anything was sent: it matches
// ErrInvalidArgument and ErrNotSent, and begins with op.
func InvalidArgument(op, format string, args ...any) error { return invalid(op, format, args...) }

// exceptionDto is the engine's error body.
type exceptionDto struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Code    *int   `json:"code"`
}

// argError is a request the client refused to send: both ErrInvalidArgument and ErrNotSent.
type argError struct {
	op  string
	err error
}

func (e *argError) Error() string { return fmt.Sprintf("%s: %v", e.op, e.err) }
func (e *argError) Unwrap() error { return e.err }
func (e *argError) Is(target error) bool {
	return target == ErrInvalidArgument || target == ErrNotSent
}

func invalid(op, format string, args ...any) error {
	return &argError{op: op, err: fmt.Errorf(format, args...)}
}

// do sends one request and decodes its answer into c.out, turning every failure into
// an *Error, *TransportError, *ResponseError or argError. It is every request's one
// path, and traces each one: a span named by its operation (spanName), with the answer's
// status and the classified outcome.
func (c *Client) do(ctx context.Context, k call) error {
	ctx, span := c.startSpan(ctx, k)
	var st sendStats
	err := c.send(ctx, k, &st)
	endSpan(span, st.status, st.resends, err)
	return err
}

// sendStats is what a span records of a request besides its error.
type sendStats struct {
	status  int // the answer's HTTP status; 0 without an answer
	resends int // sent again with a fresh token after a 401
}

// send is do without the span: it sends the request, once more with a fresh token after a
// 401 when the token source can invalidate tokens, and reads the answer. It holds the
// I/O only; what each step means is decided by functions of values: encodeBody,
// transportError (not sent or unknown outcome), resendWithNewToken, and readAnswer (the
// status, the body and the engine's error body into a result or a classified error).
func (c *Client) send(ctx context.Context, k call, st *sendStats) error {
	payload, ctype, err := encodeBody(k)
	if err != nil {
		return err
	}
	timeout := k.timeout
	if timeout <= 0 {
		timeout = c.cfg.Timeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ctx, written := transport.Track(ctx)
	inv, _ := c.cfg.TokenSource.(TokenInvalidator)
	for attempt := 1; ; attempt++ {
		tok, err := c.token(ctx, k.op, attempt)
		if err != nil {
			return err
		}
		start := time.Now()
		written.Reset()
		resp, err := c.request(ctx, k, payload, ctype, tok).Execute(k.method, k.path)
		if err != nil {
			if resp != nil && resp.RawBody() != nil {
				resp.RawBody().Close()
			}
			return transportError(k.op, err, written.Load())
		}
		st.status, st.resends = resp.StatusCode(), attempt-1
		if !resendWithNewToken(attempt, inv != nil, resp.StatusCode()) {
			return c.answer(ctx, k, resp, start)
		}
		// A cached token the engine no longer accepts (revoked, or the engine's keys
		// rotated before it expired): the request was refused before anything was done.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.RawBody(), 64<<10))
		resp.RawBody().Close()
		c.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "engine rejected the bearer token; fetching a new one",
			slog.String("op", k.op), slog.Int("status", resp.StatusCode()), slog.Duration("took", time.Since(start)))
		inv.InvalidateToken(tok)
	}
}

// encodeBody returns the body k sends and its content type: none, a RawBody as it is, or
// JSON. A body that cannot be marshalled is refused before anything is sent.
func encodeBody(k call) (payload []byte, contentType string, err error) {
	switch b := k.body.(type) {
	case nil:
		return nil, "", nil
	case RawBody:
		return b.Data, b.ContentType, nil
	}
	if payload, err = json.Marshal(k.body); err != nil {
		return nil, "", &argError{op: k.op, err: fmt.Errorf("encode request: %w", err)}
	}
	return payload, "application/json", nil
}

// token returns the bearer token for the attempt-th sending of a request, "" without a
// TokenSource. A source that fails is a *TransportError that was not sent.
func (c *Client) token(ctx context.Context, op string, attempt int) (string, error) {
	if c.cfg.TokenSource == nil {
		return "", nil
	}
	tok, err := c.cfg.TokenSource.Token(ctx)
	if err != nil {
		what := "get bearer token"
		if attempt > 1 {
			what = "get a new bearer token after the engine rejected one (401)"
		}
		return "", &TransportError{Op: op, Err: fmt.Errorf("%s: %w", what, err)}
	}
	return tok, nil
}

// request builds one sending of k: its query, body, Accept header and token.
func (c *Client) request(ctx context.Context, k call, payload []byte, contentType, tok string) *resty.Request {
	req := c.rc.R().SetContext(ctx)
	if k.query != nil {
		req.SetQueryParamsFromValues(k.query)
	}
	if payload != nil {
		req.SetHeader("Content-Type", contentType).SetBody(payload)
	}
	if _, text := k.out.(*string); text {
		// errorDetails is text/plain; asked for as JSON, the engine answers 406.
		req.SetHeader("Accept", "text/plain, application/json")
	}
	if tok != "" {
		req.SetAuthToken(tok)
	}
	return req
}

// transportError is the error of a request that got no answer: not sent (ErrNotSent)
// unless it had been written in full before the failure, then sent with its outcome
// unknown (ErrUnknownOutcome). written comes from transport.Track.
func transportError(op string, err error, written bool) error {
	return &TransportError{Op: op, Sent: written, Err: err}
}

// resendWithNewToken reports whether the answer (status) to the attempt-th sending of a
// request calls for sending it once more with a fresh token: a 401 to the first sending,
// when the token source can invalidate the token the engine refused. A 401 means the
// engine did nothing; a second one is returned as ErrUnauthorized.
func resendWithNewToken(attempt int, invalidates bool, status int) bool {
	return attempt == 1 && invalidates && status == http.StatusUnauthorized
}

// answer reads resp's body, at most Config.MaxResponseBytes of it, and turns the answer
// into the call's result (readAnswer).
func (c *Client) answer(ctx context.Context, k call, resp *resty.Response, start time.Time) error {
	raw := resp.RawBody()
	defer raw.Close()
	a := engineAnswer{status: resp.StatusCode(), header: resp.Header(), at: time.Now()}
	a.data, a.over, a.readErr = transport.ReadLimited(raw, c.cfg.MaxResponseBytes)
	c.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "engine request",
		slog.String("op", k.op), slog.Int("status", a.status), slog.Duration("took", time.Since(start)))
	return readAnswer(k, a, c.cfg.MaxResponseBytes)
}

// engineAnswer is an answer as the client read it.
type engineAnswer struct {
	status  int
	header  http.Header
	at      time.Time // when it arrived: a Retry-After date counts from it
	data    []byte
	over    bool  // the body was larger than the limit
	readErr error // the body could not be read in full
}

// readAnswer turns an answer into the call's result: nil (a 2xx, decoded into k.out),
// an *Error (the engine refused the request), or a *ResponseError (an answer that cannot
// be read as the engine's). limit is Config.MaxResponseBytes, for the message.
func readAnswer(k call, a engineAnswer, limit int64) error {
	ctype := a.header.Get("Content-Type")
	ok := a.status >= 200 && a.status < 300
	var retryAfter time.Duration
	if !ok {
		retryAfter = parseRetryAfter(a.header.Get("Retry-After"), a.at)
	}
	switch {
	case a.readErr != nil:
		return &ResponseError{Op: k.op, StatusCode: a.status, ContentType: ctype, RetryAfter: retryAfter,
			Err: fmt.Errorf("read body: %w", a.readErr)}
	case a.over:
		return &ResponseError{Op: k.op, StatusCode: a.status, ContentType: ctype, RetryAfter: retryAfter,
			Err: fmt.Errorf("body exceeds the %d-byte limit (Config.MaxResponseBytes): %w", limit, ErrResponseTooLarge)}
	case ok:
		return decodeAnswer(k, a.status, ctype, a.data)
	}
	return answerError(k, a.status, ctype, a.data, retryAfter)
}

// decodeAnswer decodes a 2xx body into k.out.
func decodeAnswer(k call, status int, ctype string, data []byte) error {
	if k.out == nil {
		return nil
	}
	if s, ok := k.out.(*string); ok {
		*s = string(data)
		return nil
	}
	if status == http.StatusNoContent || len(bytes.TrimSpace(data)) == 0 {
		return &ResponseError{Op: k.op, StatusCode: status, ContentType: ctype, Err: errors.New("empty body where JSON was expected")}
	}
	if !isJSON(ctype) {
		return &ResponseError{Op: k.op, StatusCode: status, ContentType: ctype, Snippet: snippet(data),
			Err: errors.New("content type is not JSON")}
	}
	if err := json.Unmarshal(data, k.out); err != nil {
		return &ResponseError{Op: k.op, StatusCode: status, ContentType: ctype, Snippet: snippet(data),
			Err: fmt.Errorf("decode JSON: %w", err)}
	}
	return nil
}

// answerError turns a non-2xx answer into an *Error (the engine's, or a 4xx without an
// engine body) or a *ResponseError (a 5xx that is not the engine's: unknown outcome; or
// a 404 on a task endpoint that is not the engine's answer about the task: not acted on,
// to send again), carrying retryAfter, the delay the answer's Retry-After asked for.
func answerError(k call, status int, ctype string, data []byte, retryAfter time.Duration) error {
	var dto exceptionDto
	engine := isJSON(ctype) && json.Unmarshal(data, &dto) == nil && dto.Type != ""
	var e *Error
	switch {
	case foreign404(k.taskEndpoint, status, engine, dto.Type, dto.Message):
		return &ResponseError{Op: k.op, StatusCode: status, ContentType: ctype, Snippet: snippet(data), Err: errForeign404,
			RetryAfter: retryAfter}
	case engine:
		e = newError(k.op, k.taskEndpoint, status, dto.Type, dto.Message, dto.Code)
	case status >= 400 && status < 500:
		e = newError(k.op, k.taskEndpoint, status, "", http.StatusText(status), nil)
	default:
		return &ResponseError{Op: k.op, StatusCode: status, ContentType: ctype, Snippet: snippet(data),
			Err: errors.New("not an engine error body"), RetryAfter: retryAfter}
	}
	e.RetryAfter = retryAfter
	return e
}

func isJSON(ctype string) bool {
	mt, _, err := mime.ParseMediaType(ctype)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// snippet returns the first bytes of a body, printable only, for diagnostics.
func snippet(data []byte) string {
	const n = 120
	s := []rune(strings.ToValidUTF8(string(data[:min(len(data), 4*n)]), "?"))
	s = s[:min(len(s), n)]
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, string(s))
}

// restyLogger routes resty's own warnings to slog instead of stderr.
type restyLogger struct{ l *slog.Logger }

func (r restyLogger) Errorf(format string, v ...any) {
	r.l.Error("resty: " + fmt.Sprintf(format, v...))
}
func (r restyLogger) Warnf(format string, v ...any) { r.l.Warn("resty: " + fmt.Sprintf(format, v...)) }
func (r restyLogger) Debugf(format string, v ...any) {
	r.l.Debug("resty: " + fmt.Sprintf(format, v...))
}
