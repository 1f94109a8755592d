package humantask_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/humantask"
)

// issuer is a local identity provider: a JWKS endpoint with one RSA key, and tokens
// minted with it (or with a key it does not publish).
type issuer struct {
	url      string
	key      *rsa.PrivateKey
	stranger *rsa.PrivateKey
	fetches  atomic.Int64 // of the JWKS
	rotated  atomic.Bool  // the JWKS publishes the stranger's key too, as "k2"
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	stranger, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	iss := &issuer{key: key, stranger: stranger}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		iss.fetches.Add(1)
		jwks := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}}
		if iss.rotated.Load() {
			jwks.Keys = append(jwks.Keys, jose.JSONWebKey{Key: &stranger.PublicKey, KeyID: "k2", Algorithm: "RS256", Use: "sig"})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(jwks)
	}))
	t.Cleanup(srv.Close)
	iss.url = srv.URL
	return iss
}

func (i *issuer) mint(t *testing.T, key *rsa.PrivateKey, claims map[string]any) string {
	return i.mintKid(t, key, "k1", claims)
}

func (i *issuer) mintKid(t *testing.T, key *rsa.PrivateKey, kid string, claims map[string]any) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	require.NoError(t, err)
	tok, err := jwt.Signed(sig).Claims(claims).Serialize()
	require.NoError(t, err)
	return tok
}

func TestJWTIdentity(t *testing.T) {
	iss := newIssuer(t)
	src, err := humantask.NewJWT(humantask.JWTConfig{Issuer: iss.url, Audience: "tasks", JWKSURL: iss.url + "/jwks",
		UserClaim: "preferred_username", GroupsClaim: "groups"})
	require.NoError(t, err)
	now := time.Now()
	good := map[string]any{"iss": iss.url, "aud": "tasks", "sub": "u-1", "preferred_username": "alice",
		"groups": []string{"approvers", "sales"}, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	with := func(k string, v any) map[string]any {
		c := map[string]any{}
		for kk, vv := range good {
			c[kk] = vv
		}
		c[k] = v
		return c
	}
	identify := func(auth string) (humantask.Identity, error) {
		r := httptest.NewRequest(http.MethodGet, "/tasks", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		return src.Identify(r)
	}

	who, err := identify("Bearer " + iss.mint(t, iss.key, good))
	require.NoError(t, err)
	assert.Equal(t, humantask.Identity{User: "alice", Groups: []string{"approvers", "sales"}}, who)
	// The scheme is case-insensitive (an outside tester's "bearer" was refused).
	for _, scheme := range []string{"bearer ", "BEARER ", "Bearer  "} {
		who, err := identify(scheme + iss.mint(t, iss.key, good))
		require.NoError(t, err, scheme)
		assert.Equal(t, "alice", who.User, scheme)
	}

	for name, auth := range map[string]string{
		"no token":        "",
		"not bearer":      "Basic YWxpY2U6cHc=",
		"another key":     "Bearer " + iss.mint(t, iss.stranger, good),
		"wrong audience":  "Bearer " + iss.mint(t, iss.key, with("aud", "billing")),
		"wrong issuer":    "Bearer " + iss.mint(t, iss.key, with("iss", "https://evil.example")),
		"expired":         "Bearer " + iss.mint(t, iss.key, with("exp", now.Add(-time.Hour).Unix())),
		"no user claim":   "Bearer " + iss.mint(t, iss.key, with("preferred_username", "")),
		"not a token":     "Bearer abc.def.ghi",
		"unsigned (none)": "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.",
	} {
		_, err := identify(auth)
		require.Error(t, err, name)
		assert.True(t, errors.Is(err, humantask.ErrNoIdentity), name)
		if len(auth) > 20 {
			assert.NotContains(t, err.Error(), auth[7:], "%s: the error never carries the token", name)
		}
	}
}

// Forged tokens and unknown key ids do not make every request fetch the JWKS (an
// outside tester saw one fetch per request); a key the provider rotates in is fetched
// once the interval has passed.
func TestJWTFetchesTheJWKSAtMostOncePerInterval(t *testing.T) {
	iss := newIssuer(t)
	src, err := humantask.NewJWT(humantask.JWTConfig{Issuer: iss.url, Audience: "tasks", JWKSURL: iss.url + "/jwks",
		RefetchEvery: time.Hour})
	require.NoError(t, err)
	now := time.Now()
	claims := map[string]any{"iss": iss.url, "aud": "tasks", "sub": "alice", "exp": now.Add(time.Hour).Unix()}
	identify := func(tok string) error {
		r := httptest.NewRequest(http.MethodGet, "/tasks", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		_, err := src.Identify(r)
		return err
	}
	require.NoError(t, identify(iss.mint(t, iss.key, claims)))
	for i := range 20 {
		assert.Error(t, identify(iss.mint(t, iss.stranger, claims)), "forged %d", i)
		assert.Error(t, identify(iss.mintKid(t, iss.stranger, fmt.Sprintf("unknown-%d", i), claims)), "unknown kid %d", i)
	}
	require.NoError(t, identify(iss.mint(t, iss.key, claims)))
	assert.Equal(t, int64(1), iss.fetches.Load(), "one fetch for 42 tokens, 40 of them not verifying")

	rotating, err := humantask.NewJWT(humantask.JWTConfig{Issuer: iss.url, Audience: "tasks", JWKSURL: iss.url + "/jwks",
		RefetchEvery: 50 * time.Millisecond})
	require.NoError(t, err)
	src = rotating
	require.NoError(t, identify(iss.mint(t, iss.key, claims)))
	iss.rotated.Store(true)
	rotatedToken := iss.mintKid(t, iss.stranger, "k2", claims)
	assert.Eventually(t, func() bool { return identify(rotatedToken) == nil }, 5*time.Second, 20*time.Millisecond,
		"a rotated-in key verifies once the interval has passed")
}

func TestProxyHeaderIdentity(t *testing.T) {
	_, err := humantask.NewProxyHeader(humantask.ProxyHeader{UserHeader: "X-User", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}})
	assert.Error(t, err, "a /0 names no proxy")
	src, err := humantask.NewProxyHeader(humantask.ProxyHeader{UserHeader: "X-User", GroupsHeader: "X-Groups",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}})
	require.NoError(t, err)
	r := httptest.NewRequest(http.MethodGet, "/tasks", nil)
	r.Header.Set("X-User", "alice")
	r.Header.Set("X-Groups", " approvers, ,sales ")
	r.RemoteAddr = "10.1.2.3:5555"
	who, err := src.Identify(r)
	require.NoError(t, err)
	assert.Equal(t, humantask.Identity{User: "alice", Groups: []string{"approvers", "sales"}}, who)
	r.RemoteAddr = "192.0.2.1:5555"
	_, err = src.Identify(r)
	assert.ErrorIs(t, err, humantask.ErrNoIdentity, "the header is not believed from elsewhere")

	// A proxy that adds its header to the client's, instead of replacing it: the first
	// value won, and the client chose who it was (an outside tester's find).
	r.RemoteAddr = "10.1.2.3:5555"
	r.Header.Add("X-User", "mallory")
	_, err = src.Identify(r)
	assert.ErrorIs(t, err, humantask.ErrNoIdentity, "two user headers: nobody")
	r.Header.Set("X-User", "alice")
	r.Header.Add("X-Groups", "admins")
	_, err = src.Identify(r)
	assert.ErrorIs(t, err, humantask.ErrNoIdentity, "two groups headers: nobody")
}
