package console

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// This file is who an operator is: a login form checked against bcrypt hashes with a
// signed session cookie, or a reverse proxy's authenticated header from a trusted
// address; and the CSRF tokens every form carries.

// operatorName is what an operator may be called: the name goes into the ledger's
// events and the two-person rule, so it is kept plain.
var operatorName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$`)

// ReadOperators reads an operators file: one name:bcrypt-hash per line (what
// `extworker console hash-password` prints, and htpasswd -B writes), blank lines and
// lines starting with # ignored. A line that is not one is an error naming its number,
// never its content.
func ReadOperators(path string) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("EXTWORKER_CONSOLE_OPERATORS_FILE: %w", err)
	}
	defer f.Close()
	return parseOperators(f, path)
}

func parseOperators(r io.Reader, path string) (map[string][]byte, error) {
	out := map[string][]byte{}
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		if !ok || !operatorName.MatchString(name) {
			return nil, fmt.Errorf("EXTWORKER_CONSOLE_OPERATORS_FILE %s line %d: want name:bcrypt-hash, the name of letters, digits and ._@+-", path, n)
		}
		if _, err := bcrypt.Cost([]byte(hash)); err != nil {
			return nil, fmt.Errorf("EXTWORKER_CONSOLE_OPERATORS_FILE %s line %d (%s): not a bcrypt hash (extworker console hash-password, or htpasswd -nB)", path, n, name)
		}
		if _, dup := out[strings.ToLower(name)]; dup {
			return nil, fmt.Errorf("EXTWORKER_CONSOLE_OPERATORS_FILE %s line %d: %s appears twice (names are compared without case)", path, n, name)
		}
		out[strings.ToLower(name)] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("EXTWORKER_CONSOLE_OPERATORS_FILE %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("EXTWORKER_CONSOLE_OPERATORS_FILE %s: no operators", path)
	}
	return out, nil
}

// HashPassword is what an operators file holds for password: a bcrypt hash.
func HashPassword(password string) (string, error) {
	if len(password) < 8 {
		return "", errors.New("a console password has at least 8 characters")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	return string(h), err
}

// dummyHash is compared against for unknown names, so that a login for a name that does
// not exist takes as long as one with a wrong password.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("extworker-console-no-such-operator"), bcrypt.DefaultCost)

// checkPassword returns the operator's name as the file spells it (lower case) when
// password is theirs.
func (h *handler) checkPassword(name, password string) (string, bool) {
	key := strings.ToLower(strings.TrimSpace(name))
	hash, ok := h.opts.Operators[key]
	if !ok {
		hash = dummyHash
	}
	err := bcrypt.CompareHashAndPassword(hash, []byte(password))
	return key, ok && err == nil
}

// limiter refuses logins for a name or from an address after maxFailures failures within
// failureWindow: guessing passwords goes no faster than that.
type limiter struct {
	mu       sync.Mutex
	failures map[string][]time.Time
}

const (
	maxFailures   = 5
	failureWindow = 15 * time.Minute
)

func (l *limiter) blocked(now time.Time, keys ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		if len(l.recent(now, k)) >= maxFailures {
			return true
		}
	}
	return false
}

func (l *limiter) fail(now time.Time, keys ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failures == nil {
		l.failures = map[string][]time.Time{}
	}
	if len(l.failures) > 10000 { // bounded memory under a flood of names
		clear(l.failures)
	}
	for _, k := range keys {
		l.failures[k] = append(l.recent(now, k), now)
	}
}

func (l *limiter) recent(now time.Time, k string) []time.Time {
	ts := l.failures[k]
	i := 0
	for i < len(ts) && now.Sub(ts[i]) > failureWindow {
		i++
	}
	return ts[i:]
}

// session is a logged-in operator, carried in a cookie signed with the console's key.
type session struct {
	Operator string
	Expires  time.Time
	// Nonce is the session's own random value; its CSRF token is derived from it.
	Nonce string
}

const (
	sessionCookie = "extworker_console"
	loginCookie   = "extworker_console_login"
)

// sign returns value with its HMAC appended.
func (h *handler) sign(purpose, value string) string {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(purpose + "\x00" + value))
	return value + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// verify returns the value sign signed for purpose, or false.
func (h *handler) verify(purpose, signed string) (string, bool) {
	i := strings.LastIndexByte(signed, '.')
	if i < 0 {
		return "", false
	}
	want := h.sign(purpose, signed[:i])
	return signed[:i], subtle.ConstantTimeCompare([]byte(want), []byte(signed)) == 1
}

func (s session) encode() string {
	return base64.RawURLEncoding.EncodeToString([]byte(s.Operator)) + "|" + strconv.FormatInt(s.Expires.Unix(), 10) + "|" + s.Nonce
}

func decodeSession(v string) (session, bool) {
	parts := strings.Split(v, "|")
	if len(parts) != 3 {
		return session{}, false
	}
	name, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return session{}, false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return session{}, false
	}
	return session{Operator: string(name), Expires: time.Unix(exp, 0), Nonce: parts[2]}, true
}

func randomToken() string {
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// identity is who makes the request, and the CSRF token their forms carry; ok is false
// for nobody.
type identity struct {
	Operator string
	CSRF     string
	// Session is true for a login-form session (logout applies).
	Session bool
}

// who authenticates r: by the proxy's header from a trusted address, or by the session
// cookie.
func (h *handler) who(r *http.Request) (identity, error) {
	if h.opts.AuthHeader != "" {
		if !h.trusted(r.RemoteAddr) {
			return identity{}, fmt.Errorf("the request did not come through the authenticating proxy (from %s)", r.RemoteAddr)
		}
		name := strings.TrimSpace(r.Header.Get(h.opts.AuthHeader))
		if name == "" {
			return identity{}, fmt.Errorf("the proxy named no operator (%s is empty)", h.opts.AuthHeader)
		}
		if !operatorName.MatchString(name) {
			return identity{}, fmt.Errorf("the proxy named an operator the console cannot record (%s must be letters, digits and ._@+-)", h.opts.AuthHeader)
		}
		// Without a session, the token is bound to the operator: only this process's key
		// makes it.
		return identity{Operator: name, CSRF: h.sign("csrf", "header|"+name)}, nil
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return identity{}, errors.New("not logged in")
	}
	v, ok := h.verify("session", c.Value)
	if !ok {
		return identity{}, errors.New("not logged in")
	}
	s, ok := decodeSession(v)
	if !ok || !h.now().Before(s.Expires) {
		return identity{}, errors.New("the session has expired; log in again")
	}
	if _, known := h.opts.Operators[s.Operator]; !known {
		return identity{}, errors.New("the operator is no longer in the operators file")
	}
	return identity{Operator: s.Operator, CSRF: h.sign("csrf", "session|"+s.Nonce), Session: true}, nil
}

// trusted reports whether remote (host:port) is one of the trusted proxies.
func (h *handler) trusted(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range h.opts.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// checkCSRF refuses a state-changing request without the token of the session (or of
// the login form), or from another origin.
func (h *handler) checkCSRF(r *http.Request, want string) error {
	if origin := r.Header.Get("Origin"); origin != "" && origin != "null" && !h.sameOrigin(r, origin) {
		return fmt.Errorf("the form came from another origin (%s)", origin)
	}
	if ref := r.Header.Get("Referer"); ref != "" && !h.sameOrigin(r, ref) {
		return errors.New("the form came from another site")
	}
	got := r.PostFormValue("csrf")
	if got == "" || want == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return errors.New("the form's CSRF token is missing or wrong; reload the page and try again")
	}
	return nil
}

// sameOrigin reports whether u (an Origin or a Referer) names this console's host. The
// scheme is not compared: behind a proxy that terminates TLS the console sees plain HTTP
// while the browser says https.
func (h *handler) sameOrigin(r *http.Request, u string) bool {
	p, err := url.Parse(u)
	return err == nil && p.Host != "" && strings.EqualFold(p.Host, r.Host)
}

// OperatorLine is an operators file's line for name with hash, after checking the name
// is one the console accepts.
func OperatorLine(name, hash string) (string, error) {
	if !operatorName.MatchString(name) {
		return "", fmt.Errorf("operator name %q: letters, digits and ._@+- only, starting with a letter or digit, at most 64", name)
	}
	return name + ":" + hash, nil
}
