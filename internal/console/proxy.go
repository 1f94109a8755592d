package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file is the proxy's header (Options.AuthHeader): the operator a trusted reverse
// proxy authenticated, believed only when the register of operators (the ledger's
// extworker_operators, which the ledger checks the console's attestations against)
// knows them, and named as the register spells them. Their forms' CSRF token is bound to
// the operator and to a random value in a signed cookie of the browser's own, which the
// console issues for SessionTTL and then renews: a token is good in one browser, for a
// while, never for a name for the process's whole life.

// authError is a refused authentication with its HTTP status and page title.
type authError struct {
	status int
	title  string
	msg    string
}

func (e authError) Error() string { return e.msg }

// errAmbiguousOperator: the proxy's header named more than one operator.
var errAmbiguousOperator = errors.New("the proxy named more than one operator")

// csrfCookie is, in header mode, the browser's random value its forms' token is bound
// to, signed with the time it was issued.
const csrfCookie = "extworker_console_csrf"

// proxied is the operator the trusted proxy's header names: exactly one value, one name,
// a registered operator's, as the register spells it.
func (h *handler) proxied(r *http.Request) (identity, error) {
	if !h.trusted(r.RemoteAddr) {
		return identity{}, fmt.Errorf("the request did not come through the authenticating proxy (from %s)", r.RemoteAddr)
	}
	values := r.Header.Values(h.opts.AuthHeader)
	if len(values) > 1 || len(values) == 1 && strings.Contains(values[0], ",") {
		return identity{}, fmt.Errorf("%w (%s has %d values); the proxy must replace the header, not add to it", errAmbiguousOperator,
			h.opts.AuthHeader, len(values)+strings.Count(strings.Join(values, ""), ","))
	}
	name := ""
	if len(values) == 1 {
		name = strings.TrimSpace(values[0])
	}
	if name == "" {
		return identity{}, fmt.Errorf("the proxy named no operator (%s is empty)", h.opts.AuthHeader)
	}
	if !operatorName.MatchString(name) {
		return identity{}, fmt.Errorf("the proxy named an operator the console cannot record (%s must be letters, digits and ._@+-)", h.opts.AuthHeader)
	}
	operator, err := h.registered(r.Context(), name)
	if err != nil {
		return identity{}, err
	}
	return identity{Operator: operator}, nil
}

// registered is name as the register of operators spells it, or why not.
func (h *handler) registered(ctx context.Context, name string) (string, error) {
	var operator string
	err := h.opts.DB.QueryRow(ctx, `SELECT name FROM extworker_operators WHERE lower(name) = lower($1)`, name).Scan(&operator)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", authError{http.StatusForbidden, "Not an operator",
			name + " is not a registered operator of this ledger (its owner registers operators: extworker operators add NAME)"}
	case err != nil:
		return "", authError{http.StatusServiceUnavailable, "Unavailable", "the register of operators could not be read: " + err.Error()}
	}
	return operator, nil
}

// bindHeaderToken gives id, proxied, its forms' CSRF token: bound to the operator and
// to the browser's csrfCookie, issued (by a page read) when the browser has none or its
// own has run out. A form from a browser without a good one has no token to match.
func (h *handler) bindHeaderToken(w http.ResponseWriter, r *http.Request, id *identity) {
	nonce, ok := h.browserNonce(r)
	if !ok {
		if r.Method != http.MethodGet {
			return
		}
		nonce = randomToken() + "|" + strconv.FormatInt(h.now().Unix(), 10)
		h.setCookie(w, r, &http.Cookie{Name: csrfCookie, Value: h.sign("browser", nonce), MaxAge: int(h.opts.SessionTTL / time.Second)})
	}
	id.CSRF = h.sign("csrf", "header|"+id.Operator+"|"+nonce)
}

// browserNonce is the value of r's csrfCookie, when this console signed it less than
// SessionTTL ago.
func (h *handler) browserNonce(r *http.Request) (string, bool) {
	c, err := r.Cookie(csrfCookie)
	if err != nil {
		return "", false
	}
	v, ok := h.verify("browser", c.Value)
	if !ok {
		return "", false
	}
	_, issued, _ := strings.Cut(v, "|")
	at, err := strconv.ParseInt(issued, 10, 64)
	if err != nil || !h.now().Before(time.Unix(at, 0).Add(h.opts.SessionTTL)) {
		return "", false
	}
	return v, true
}
