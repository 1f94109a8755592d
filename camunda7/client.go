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
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/go-resty/resty/v2"
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

// send is do without the span.
func (c *Client) send(ctx context.Context, k call, st *sendStats) error {
	var payload []byte
	contentType := ""
	switch b := k.body.(type) {
	case nil:
	case RawBody:
		payload, contentType = b.Data, b.ContentType
	default:
		var err error
		if payload, err = json.Marshal(b); err != nil {
			return &argError{op: k.op, err: fmt.Errorf("encode request: %w", err)}
		}
		contentType = "application/json"
	}
	if k.timeout <= 0 {
		k.timeout = c.cfg.Timeout
	}
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()

	// wrote turns true once the whole request has been written to a connection: the line
	// between "certainly not sent" and "outcome unknown".
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				wrote.Store(true)
			}
		},
	})
	inv, _ := c.cfg.TokenSource.(TokenInvalidator)
	var resp *resty.Response
	var start time.Time
	for attempt := 1; ; attempt++ {
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
		var tok string
		if c.cfg.TokenSource != nil {
			var err error
			if tok, err = c.cfg.TokenSource.Token(ctx); err != nil {
				what := "get bearer token"
				if attempt > 1 {
					what = "get a new bearer token after the engine rejected one (401)"
				}
				return &TransportError{Op: k.op, Err: fmt.Errorf("%s: %w", what, err)}
			}
			req.SetAuthToken(tok)
		}
		start = time.Now()
		wrote.Store(false)
		var err error
		resp, err = req.Execute(k.method, k.path)
		if err != nil {
			if resp != nil && resp.RawBody() != nil {
				resp.RawBody().Close()
			}
			return &TransportError{Op: k.op, Sent: wrote.Load(), Err: err}
		}
		st.status, st.resends = resp.StatusCode(), attempt-1
		if attempt > 1 || inv == nil || resp.StatusCode() != http.StatusUnauthorized {
			break
		}
		// A cached token the engine no longer accepts (revoked, or the engine's keys
		// rotated before it expired): the request was refused before anything was done,
		// so it is sent once more with a fresh token.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.RawBody(), 64<<10))
		resp.RawBody().Close()
		c.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "engine rejected the bearer token; fetching a new one",
			slog.String("op", k.op), slog.Int("status", resp.StatusCode()), slog.Duration("took", time.Since(start)))
		inv.InvalidateToken(tok)
	}
	raw := resp.RawBody()
	defer raw.Close()
	status := resp.StatusCode()
	ctype := resp.Header().Get("Content-Type")
	ok := status >= 200 && status < 300
	var retryAfter time.Duration
	if !ok {
		retryAfter = parseRetryAfter(resp.Header().Get("Retry-After"), time.Now())
	}
	data, rerr := io.ReadAll(io.LimitReader(raw, c.cfg.MaxResponseBytes+1))
	c.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "engine request",
		slog.String("op", k.op), slog.Int("status", status), slog.Duration("took", time.Since(start)))
	if rerr != nil {
		return &ResponseError{Op: k.op, StatusCode: status, ContentType: ctype, RetryAfter: retryAfter,
			Err: fmt.Errorf("read body: %w", rerr)}
	}
	if int64(len(data)) > c.cfg.MaxResponseBytes {
		return &ResponseError{Op: k.op, StatusCode: status, ContentType: ctype, RetryAfter: retryAfter,
			Err: fmt.Errorf("body exceeds the %d-byte limit (Config.MaxResponseBytes): %w", c.cfg.MaxResponseBytes, ErrResponseTooLarge)}
	}
	if ok {
		return decodeAnswer(k, status, ctype, data)
	}
	err := answerError(k, status, ctype, data)
	switch e := err.(type) {
	case *Error:
		e.RetryAfter = retryAfter
	case *ResponseError:
		e.RetryAfter = retryAfter
	}
	return err
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
// engine body) or a *ResponseError (a 5xx that is not the engine's: outcome unknown; or
// a 404 on a task endpoint that is not the engine's answer about the task: not acted on,
// to send again).
func answerError(k call, status int, ctype string, data []byte) error {
	var dto exceptionDto
	engine := isJSON(ctype) && json.Unmarshal(data, &dto) == nil && dto.Type != ""
	if foreign404(k.taskEndpoint, status, engine, dto.Type, dto.Message) {
		return &ResponseError{Op: k.op, StatusCode: status, ContentType: ctype, Snippet: snippet(data), Err: errForeign404}
	}
	if engine {
		return newError(k.op, k.taskEndpoint, status, dto.Type, dto.Message, dto.Code)
	}
	if status >= 400 && status < 500 {
		return newError(k.op, k.taskEndpoint, status, "", http.StatusText(status), nil)
	}
	return &ResponseError{Op: k.op, StatusCode: status, ContentType: ctype, Snippet: snippet(data),
		Err: errors.New("not an engine error body")}
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
