package humantask

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"

	"github.com/extworker/extworker/internal/webtrust"
)

// Identity is who sends a request: a user id and the groups it is in, as the engine's
// identity links name them.
type Identity struct {
	User   string
	Groups []string
}

// IdentitySource tells who sends a request, or returns an error (answered 401, its
// text never carrying a token).
type IdentitySource interface {
	Identify(r *http.Request) (Identity, error)
}

// ErrNoIdentity is a request whose sender could not be established.
var ErrNoIdentity = errors.New("humantask: no verified identity")

// ProxyHeader takes the identity from headers a reverse proxy sets after authenticating
// the user, believed only from the proxy's own addresses: the console's rule (package
// internal/webtrust, which both use).
type ProxyHeader struct {
	// UserHeader names the user, e.g. "X-Forwarded-User". Required.
	UserHeader string
	// GroupsHeader lists the user's groups, comma-separated, e.g. "X-Forwarded-Groups".
	// Empty: no groups.
	GroupsHeader string
	// TrustedProxies are the proxy's addresses; no wider than /8 (IPv4) or /32 (IPv6).
	TrustedProxies []netip.Prefix
}

// NewProxyHeader checks p: a header name, and trusted proxies that name proxies (a /0
// would believe the header from anyone).
func NewProxyHeader(p ProxyHeader) (*ProxyHeader, error) {
	if p.UserHeader == "" {
		return nil, errors.New("humantask: ProxyHeader.UserHeader is required")
	}
	if len(p.TrustedProxies) == 0 {
		return nil, errors.New("humantask: ProxyHeader.TrustedProxies is required")
	}
	ps, err := webtrust.CheckProxies(p.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("humantask: %w", err)
	}
	p.TrustedProxies = ps
	return &p, nil
}

// Identify believes the headers only from a trusted proxy.
func (p *ProxyHeader) Identify(r *http.Request) (Identity, error) {
	if !webtrust.FromProxy(p.TrustedProxies, r.RemoteAddr) {
		return Identity{}, fmt.Errorf("%w: not from a trusted proxy", ErrNoIdentity)
	}
	// One value each, as the console asks: a proxy that adds its header to the client's
	// instead of replacing it would otherwise let the client's value decide who it is.
	if n := len(r.Header.Values(p.UserHeader)); n > 1 {
		return Identity{}, fmt.Errorf("%w: %s has %d values; the proxy must replace the header, not add to it", ErrNoIdentity, p.UserHeader, n)
	}
	if n := len(r.Header.Values(p.GroupsHeader)); p.GroupsHeader != "" && n > 1 {
		return Identity{}, fmt.Errorf("%w: %s has %d values; the proxy must replace the header, not add to it", ErrNoIdentity, p.GroupsHeader, n)
	}
	user := r.Header.Get(p.UserHeader)
	if user == "" {
		return Identity{}, fmt.Errorf("%w: no %s header", ErrNoIdentity, p.UserHeader)
	}
	id := Identity{User: user}
	if p.GroupsHeader != "" {
		for g := range strings.SplitSeq(r.Header.Get(p.GroupsHeader), ",") {
			if g = strings.TrimSpace(g); g != "" {
				id.Groups = append(id.Groups, g)
			}
		}
	}
	return id, nil
}

// JWTConfig configures a bearer-token identity: tokens signed by a key of the JWKS at
// JWKSURL, issued by Issuer, for Audience.
type JWTConfig struct {
	Issuer   string
	Audience string
	JWKSURL  string
	// UserClaim names the user; default "sub" (e.g. "preferred_username").
	UserClaim string
	// GroupsClaim lists the user's groups (an array of strings); empty: no groups.
	GroupsClaim string
	// Algorithms allowed; default RS256 and ES256.
	Algorithms []string
	// HTTPClient fetches the JWKS; default a client with a 10s timeout (TLS verified).
	HTTPClient *http.Client
	// RefetchEvery bounds how often the JWKS is fetched again for a token none of its
	// keys verifies (a rotated key, or a forgery); default 10s.
	RefetchEvery time.Duration
}

// JWT verifies "Authorization: Bearer" tokens with go-oidc: signature against the JWKS
// (fetched and cached, fetched again for a token no cached key verifies, at most once
// per RefetchEvery), issuer, audience and expiry.
type JWT struct {
	cfg      JWTConfig
	verifier *oidc.IDTokenVerifier
}

// NewJWT returns a JWT identity source.
func NewJWT(cfg JWTConfig) (*JWT, error) {
	if cfg.Issuer == "" || cfg.Audience == "" || cfg.JWKSURL == "" {
		return nil, errors.New("humantask: JWTConfig needs Issuer, Audience and JWKSURL")
	}
	if cfg.UserClaim == "" {
		cfg.UserClaim = "sub"
	}
	if len(cfg.Algorithms) == 0 {
		cfg.Algorithms = []string{oidc.RS256, oidc.ES256}
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.RefetchEvery == 0 {
		cfg.RefetchEvery = 10 * time.Second
	}
	algs := make([]jose.SignatureAlgorithm, len(cfg.Algorithms))
	for i, a := range cfg.Algorithms {
		algs[i] = jose.SignatureAlgorithm(a)
	}
	keys := &keySet{url: cfg.JWKSURL, algs: algs, client: cfg.HTTPClient, every: cfg.RefetchEvery, now: time.Now}
	v := oidc.NewVerifier(cfg.Issuer, keys, &oidc.Config{ClientID: cfg.Audience, SupportedSigningAlgs: cfg.Algorithms})
	return &JWT{cfg: cfg, verifier: v}, nil
}

// Identify verifies r's bearer token. Its errors name what failed, never the token.
func (j *JWT) Identify(r *http.Request) (Identity, error) {
	// The scheme is case-insensitive (RFC 9110 11.1): "bearer" is "Bearer".
	scheme, raw, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	raw = strings.TrimSpace(raw)
	if !strings.EqualFold(scheme, "Bearer") || raw == "" {
		return Identity{}, fmt.Errorf("%w: no bearer token", ErrNoIdentity)
	}
	tok, err := j.verifier.Verify(r.Context(), raw)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: the token does not verify", ErrNoIdentity)
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return Identity{}, fmt.Errorf("%w: the token's claims do not decode", ErrNoIdentity)
	}
	user, _ := claims[j.cfg.UserClaim].(string)
	if user == "" {
		return Identity{}, fmt.Errorf("%w: the token has no %s claim", ErrNoIdentity, j.cfg.UserClaim)
	}
	id := Identity{User: user}
	if j.cfg.GroupsClaim != "" {
		gs, _ := claims[j.cfg.GroupsClaim].([]any)
		for _, g := range gs {
			if s, ok := g.(string); ok && s != "" {
				id.Groups = append(id.Groups, s)
			}
		}
	}
	return id, nil
}
