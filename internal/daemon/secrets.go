package daemon

// Secrets: read from files, kept out of messages, and the OAuth2 token source.
//
// Every secret variable (the fields of config tagged secret:"true" or secret:"url":
// EXTWORKER_ENGINE_PASSWORD, EXTWORKER_ENGINE_TOKEN, EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET,
// EXTWORKER_DATABASE_URL, EXTWORKER_ENGINE_URL, EXTWORKER_AMQP_URL, ...) can instead be
// read from a file: EXTWORKER_<NAME>_FILE=/run/secrets/name. The file's content is the
// value, less one trailing newline. Setting both the variable and its _FILE is an error;
// so is a file that cannot be read or is empty. Messages name the variable and the path,
// never the content. The files are read after envconfig has processed the environment, so
// a value from a file replaces the variable's default.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"strings"
	"sync"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/extworker/extworker/camunda7"
)

// maxSecretFile bounds what a _FILE may hold; secrets are small.
const maxSecretFile = 64 << 10

// ConfigVar is one EXTWORKER_ variable: its name, its field in config (or opsConfig) and
// how it is masked.
type ConfigVar struct {
	Name        string // EXTWORKER_ENGINE_URL
	secret      string // "", "true" (masked whole) or "url" (password inside masked)
	def         string // the default
	field       reflect.Value
	structField reflect.StructField
}

// vars lists c's variables in declaration order; the fields are addressable when c is a
// pointer's target.
func (c *Config) vars() []ConfigVar { return SpecVars(c) }

// SpecVars lists the variables of spec, a pointer to a struct whose exported fields carry
// envconfig tags, in declaration order.
func SpecVars(spec any) []ConfigVar {
	v := reflect.ValueOf(spec).Elem()
	t := v.Type()
	var out []ConfigVar
	for i := range t.NumField() {
		f := t.Field(i)
		name, ok := f.Tag.Lookup("envconfig")
		if !ok || !f.IsExported() {
			continue
		}
		out = append(out, ConfigVar{Name: envPrefix + name, secret: f.Tag.Get("secret"), def: f.Tag.Get("default"),
			field: v.Field(i), structField: f})
	}
	return out
}

// readSecretFiles fills secret fields from their EXTWORKER_*_FILE files and returns every
// problem found.
func (c *Config) readSecretFiles(lookup func(string) (string, bool)) []error {
	var errs []error
	for _, cv := range c.vars() {
		if cv.secret == "" || cv.field.Kind() != reflect.String {
			continue
		}
		path, ok := lookup(cv.Name + "_FILE")
		if !ok || path == "" {
			continue
		}
		if v, set := lookup(cv.Name); set && v != "" {
			errs = append(errs, fmt.Errorf("%s and %s_FILE are both set: choose one", cv.Name, cv.Name))
			continue
		}
		val, err := readSecretFile(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s_FILE: %w", cv.Name, err))
			continue
		}
		cv.field.SetString(val)
		if c.fromFile == nil {
			c.fromFile = map[string]string{}
		}
		c.fromFile[cv.Name] = path
	}
	return errs
}

// readSecretFile returns a file's content less one trailing newline. Its errors name the
// path and never the content.
func readSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return "", fmt.Errorf("read %s: %w", path, pe.Err)
		}
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxSecretFile {
		return "", fmt.Errorf("%s is larger than %d bytes", path, maxSecretFile)
	}
	s := string(b)
	s = strings.TrimSuffix(s, "\n")
	s = strings.TrimSuffix(s, "\r")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// secrets returns every secret value in c (whole secrets, and the passwords inside URLs),
// for scrub. Defaults are public (the local test database's password) and left out.
func (c *Config) secrets() []string {
	var out []string
	for _, cv := range c.vars() {
		if cv.field.Kind() != reflect.String || cv.field.String() == "" || cv.field.String() == cv.def {
			continue
		}
		switch cv.secret {
		case "true":
			out = append(out, cv.field.String())
		case "url":
			out = append(out, dsnSecrets(cv.field.String())...)
		}
	}
	return out
}

// dsnSecrets returns the password in a URL's user info and the values of password-like
// parameters in a URL or a key=value connection string.
func dsnSecrets(dsn string) []string {
	var out []string
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		// A password equal to its user name (local databases) hides nothing, and
		// scrubbing it would mangle every message that names the user.
		if p, ok := u.User.Password(); ok && p != "" && p != u.User.Username() {
			out = append(out, p, url.QueryEscape(p), url.PathEscape(p))
		}
	}
	for _, k := range []string{"password", "sslpassword"} {
		if v, ok := dsnParam(dsn, k); ok && v != "" {
			out = append(out, v)
		}
	}
	return out
}

// dsnParam finds a parameter in a URL's query or a key=value connection string.
func dsnParam(dsn, key string) (string, bool) {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", false
		}
		q := u.Query()
		return q.Get(key), q.Has(key)
	}
	for _, f := range strings.Fields(dsn) {
		if k, v, ok := strings.Cut(f, "="); ok && k == key {
			return strings.Trim(v, "'"), true
		}
	}
	return "", false
}

// Scrub replaces every occurrence of the given secrets in s with ***: the last line of
// defence for text that came from elsewhere (a driver's error message).
func Scrub(s string, secrets ...string) string {
	for _, sec := range secrets {
		if len(sec) >= 3 { // shorter ones would mangle ordinary text; they are masked where they are known
			s = strings.ReplaceAll(s, sec, "***")
		}
	}
	return s
}

// scrubbedError is an error whose text went through scrub; errors.Is and errors.As still
// see the original.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// ScrubError hides c's secrets in err's text, keeping its chain.
func (c *Config) ScrubError(err error) error {
	if err == nil {
		return nil
	}
	msg := Scrub(err.Error(), c.secrets()...)
	if msg == err.Error() {
		return err
	}
	return &scrubbedError{msg: msg, err: err}
}

// oauthTokenSource fetches OAuth2 client-credentials tokens and caches each until shortly
// before it expires, or until the engine rejects it (InvalidateToken: the camunda7 client
// then fetches a new one and retries the request once). Unlike oauth2.ReuseTokenSource it
// takes the request's context, so fetching a token is cancelled with the request that
// needed it.
type oauthTokenSource struct {
	cfg    clientcredentials.Config
	client *http.Client // for the token endpoint: the engine's TLS settings and timeout

	mu  sync.Mutex
	tok *oauth2.Token
}

var (
	_ camunda7.TokenSource      = (*oauthTokenSource)(nil)
	_ camunda7.TokenInvalidator = (*oauthTokenSource)(nil)
)

func NewOAuthTokenSource(c Config, tc *tls.Config) *oauthTokenSource {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if tc != nil {
		tr.TLSClientConfig = tc.Clone()
	}
	return &oauthTokenSource{
		cfg: clientcredentials.Config{ClientID: c.EngineOAuthClientID, ClientSecret: c.EngineOAuthClientSecret,
			TokenURL: c.EngineOAuthTokenURL, Scopes: c.EngineOAuthScopes},
		client: &http.Client{Transport: tr, Timeout: c.EngineTimeout},
	}
}

// Token returns the cached access token, or fetches a new one when it is missing or
// expires within oauth2's expiry delta (10s). One fetch at a time; others wait for it.
func (s *oauthTokenSource) Token(ctx context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tok.Valid() {
		return s.tok.AccessToken, nil
	}
	tok, err := s.cfg.Token(context.WithValue(ctx, oauth2.HTTPClient, s.client))
	if err != nil {
		return "", &tokenError{url: s.cfg.TokenURL, err: err}
	}
	if tok.AccessToken == "" {
		return "", &tokenError{url: s.cfg.TokenURL, err: errors.New("the answer holds no access_token")}
	}
	s.tok = tok
	return tok.AccessToken, nil
}

// InvalidateToken drops the cached token if it is still token, the one the engine
// rejected, so the next Token fetches a new one. Requests that were sent with the same
// token and rejected after another request already replaced it leave the new one alone.
func (s *oauthTokenSource) InvalidateToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tok != nil && s.tok.AccessToken == token {
		s.tok = nil
	}
}

// tokenError is a token the token endpoint did not give.
type tokenError struct {
	url string
	err error
}

func (e *tokenError) Error() string {
	return fmt.Sprintf("OAuth2 token from %s: %v", RedactURL(e.url), e.err)
}
func (e *tokenError) Unwrap() error { return e.err }

// TokenRejected reports whether the token endpoint refused the client's credentials
// (400 invalid_client or invalid_scope, 401, 403), which retrying cannot fix.
func TokenRejected(err error) bool {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.Response == nil {
		return false
	}
	switch re.Response.StatusCode {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden:
		return true
	}
	return false
}
