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
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/extworker/extworker/internal/webtrust"
	"golang.org/x/crypto/bcrypt"
)

// This file is who an operator is: a login form checked against bcrypt hashes with a
// signed session cookie, or a reverse proxy's authenticated header from a trusted
// address; and the CSRF tokens every form carries.

// operatorName is what an operator may be called: the name goes into the ledger's
// events and the two-person rule, so it is kept plain.
var operatorName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$`)

// ReadOperators reads an operators file: one name:bcrypt-hash per line (what
// `extworker console hash-password` prints, and htpasswd -nBC 10 writes), blank lines and
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
		cost, err := bcrypt.Cost([]byte(hash))
		if err != nil {
			return nil, fmt.Errorf("EXTWORKER_CONSOLE_OPERATORS_FILE %s line %d (%s): not a bcrypt hash (extworker console hash-password, or htpasswd -nBC 10)", path, n, name)
		}
		if cost < minFileCost {
			return nil, fmt.Errorf("EXTWORKER_CONSOLE_OPERATORS_FILE %s line %d (%s): bcrypt cost %d; at least %d (extworker console hash-password, or htpasswd -nBC 10)", path, n, name, cost, minFileCost)
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

// minFileCost is the least bcrypt cost an operators file may have: below it a stolen
// file's hashes are cheap to guess, and (with a dummy hash of another cost) a login's
// time tells names apart.
const minFileCost = 10

// hashCost is the one bcrypt cost of ops' hashes: every login, for a name there or not,
// then compares one hash of that cost (the unknown name's against a dummy) and takes as
// long. Hashes of different costs are refused: the time would tell their names apart.
func hashCost(ops map[string][]byte) (int, error) {
	cost := 0
	for name, h := range ops {
		c, err := bcrypt.Cost(h)
		if err != nil {
			return 0, fmt.Errorf("console: operator %s: not a bcrypt hash", name)
		}
		if cost != 0 && c != cost {
			return 0, fmt.Errorf("console: the operators' hashes have different bcrypt costs (%d and %d): a login's time would tell their names apart; hash every password at one cost", cost, c)
		}
		cost = c
	}
	return cost, nil
}

// dummyHash is a hash of cost for a password nobody knows: a login for a name that does
// not exist is compared against it, and takes as long as one with a wrong password.
func dummyHash(cost int) ([]byte, error) {
	return bcrypt.GenerateFromPassword([]byte(randomToken()), cost)
}

// checkPassword returns the operator's name as the file spells it (lower case) when
// password is theirs. It compares one hash whether the name exists or not.
func (h *handler) checkPassword(name, password string) (string, bool) {
	key := strings.ToLower(strings.TrimSpace(name))
	hash, ok := h.opts.Operators[key]
	if !ok {
		hash = h.dummy
	}
	err := bcrypt.CompareHashAndPassword(hash, []byte(password))
	return key, ok && err == nil
}

// loginKeys are what a login attempt for name is counted on (see throttle): the device
// when the browser has logged in as name before, else the name and the address.
func (h *handler) loginKeys(r *http.Request, name string) []throttleKey {
	if d, ok := h.device(r, name); ok {
		return []throttleKey{{"device:" + d, deviceRule}}
	}
	n := "(not a valid name)" // one key for them all: memory stays bounded
	if operatorName.MatchString(name) {
		n = strings.ToLower(name)
	}
	return []throttleKey{{"name:" + n, nameRule}, {clientKey(r.RemoteAddr), addressRule}}
}

// device is the device cookie's id when it says this browser logged in as name before.
func (h *handler) device(r *http.Request, name string) (string, bool) {
	c, err := r.Cookie(deviceCookie)
	if err != nil {
		return "", false
	}
	v, ok := h.verify("device", c.Value)
	if !ok {
		return "", false
	}
	who, id, ok := strings.Cut(v, "|")
	return id, ok && who == strings.ToLower(strings.TrimSpace(name))
}

// setDevice marks this browser as one operator has logged in from, for 30 days.
func (h *handler) setDevice(w http.ResponseWriter, r *http.Request, operator string) {
	h.setCookie(w, r, &http.Cookie{Name: deviceCookie, Value: h.sign("device", operator+"|"+randomToken()), Path: "/login",
		MaxAge: int(deviceTTL / time.Second)})
}

const deviceTTL = 30 * 24 * time.Hour

// session is a logged-in operator, carried in a cookie signed with the console's key.
type session struct {
	Operator string
	Expires  time.Time
	// Nonce is the session's own random value; its CSRF token is derived from it.
	Nonce string
}

// sessionGrace is how long after its session's end a browser keeps the session cookie:
// a form sent in that time is kept for its operator (keepForm), nothing else is done.
const sessionGrace = time.Hour

// The console's cookies: all HttpOnly, SameSite=Strict, and Secure over TLS.
const (
	sessionCookie = "extworker_console"
	loginCookie   = "extworker_console_login"  // the login form's CSRF binding
	deviceCookie  = "extworker_console_device" // this browser logged in as an operator before
	flashCookie   = "extworker_console_flash"  // what the last form did, for the next page
	draftCookie   = "extworker_console_draft"  // a form as typed, to fill in again
)

// secure reports whether cookies set in answer to r are marked Secure: over TLS, or
// when Options.SecureCookies says a proxy in front terminates it.
func (h *handler) secure(r *http.Request) bool { return h.opts.SecureCookies || r.TLS != nil }

// setCookie sets c with the attributes every console cookie has.
func (h *handler) setCookie(w http.ResponseWriter, r *http.Request, c *http.Cookie) {
	c.HttpOnly, c.Secure, c.SameSite = true, h.secure(r), http.SameSiteStrictMode
	if c.Path == "" {
		c.Path = "/"
	}
	http.SetCookie(w, c)
}

// clearCookie removes the cookie name (set at path).
func (h *handler) clearCookie(w http.ResponseWriter, r *http.Request, name, path string) {
	h.setCookie(w, r, &http.Cookie{Name: name, Value: "", Path: path, MaxAge: -1})
}

// revocations are the sessions logged out before they expired, by nonce, until they
// expire. They live in the process: a replica that shares the session key does not
// know another's logouts (docs/console.md).
type revocations struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (v *revocations) revoke(now time.Time, s session) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = map[string]time.Time{}
	}
	for n, exp := range v.m {
		if !now.Before(exp) {
			delete(v.m, n)
		}
	}
	v.m[s.Nonce] = s.Expires
}

func (v *revocations) revoked(nonce string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.m[nonce]
	return ok
}

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
	// Session is true for a login-form session (logout applies), with its nonce and
	// expiry.
	Session bool
	nonce   string
	expires time.Time
}

// who authenticates r: by the proxy's header from a trusted address, or by the session
// cookie.
func (h *handler) who(r *http.Request) (identity, error) {
	if h.opts.AuthHeader != "" {
		return h.proxied(r)
	}
	s, err := h.sessionOf(r)
	if err != nil {
		return identity{}, err
	}
	return identity{Operator: s.Operator, CSRF: h.sessionCSRF(s.Nonce), Session: true, nonce: s.Nonce, expires: s.Expires}, nil
}

// sessionCSRF is the CSRF token of the session with nonce.
func (h *handler) sessionCSRF(nonce string) string { return h.sign("csrf", "session|"+nonce) }

// sessionOf is r's session: signed, not expired, not logged out, of an operator still
// in the file.
func (h *handler) sessionOf(r *http.Request) (session, error) {
	s, ok := h.signedSession(r)
	switch {
	case !ok:
		return session{}, errors.New("not logged in")
	case !h.now().Before(s.Expires):
		return session{}, errors.New("the session has expired; log in again")
	case h.revoked.revoked(s.Nonce):
		return session{}, errors.New("the session was logged out; log in again")
	}
	if _, known := h.opts.Operators[s.Operator]; !known {
		return session{}, errors.New("the operator is no longer in the operators file")
	}
	return s, nil
}

// signedSession is the session r's cookie holds, signed by this console, whether it is
// still good or not.
func (h *handler) signedSession(r *http.Request) (session, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, false
	}
	v, ok := h.verify("session", c.Value)
	if !ok {
		return session{}, false
	}
	return decodeSession(v)
}

// endedSession is r's session when it is one this console signed for an operator in
// the file, that has expired or was logged out since: whose forms are kept (keepForm).
func (h *handler) endedSession(r *http.Request) (session, bool) {
	s, ok := h.signedSession(r)
	if !ok {
		return session{}, false
	}
	if _, known := h.opts.Operators[s.Operator]; !known {
		return session{}, false
	}
	return s, !h.now().Before(s.Expires) || h.revoked.revoked(s.Nonce)
}

// trusted reports whether remote (host:port) is one of the trusted proxies.
func (h *handler) trusted(remote string) bool {
	return webtrust.FromProxy(h.opts.TrustedProxies, remote)
}

// checkCSRF refuses a state-changing request without the token of the session (or of
// the login form), or from another origin.
func (h *handler) checkCSRF(r *http.Request, want string) error {
	if err := r.ParseForm(); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return fmt.Errorf("the form is larger than the console takes (%d bytes); nothing was done", mbe.Limit)
		}
		return errors.New("the form could not be read; nothing was done")
	}
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

// sameOrigin reports whether u (an Origin or a Referer) names this console's site
// (webtrust.SameOrigin: its host, over https when the console serves TLS).
func (h *handler) sameOrigin(r *http.Request, u string) bool { return webtrust.SameOrigin(r, u) }

// CheckTrustedProxies refuses trusted proxies so wide that they name no proxy
// (webtrust.CheckProxies); ps comes back masked.
func CheckTrustedProxies(ps []netip.Prefix) ([]netip.Prefix, error) {
	out, err := webtrust.CheckProxies(ps)
	if err != nil {
		return nil, fmt.Errorf("EXTWORKER_CONSOLE_TRUSTED_PROXIES: %w: whoever is in it can name any operator; list the proxy's own addresses", err)
	}
	return out, nil
}

// OperatorLine is an operators file's line for name with hash, after checking the name
// is one the console accepts.
func OperatorLine(name, hash string) (string, error) {
	if !operatorName.MatchString(name) {
		return "", fmt.Errorf("operator name %q: letters, digits and ._@+- only, starting with a letter or digit, at most 64", name)
	}
	return name + ":" + hash, nil
}
