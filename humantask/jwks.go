package humantask

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// keySet is a JWT identity's JWKS, an oidc.KeySet. It is fetched again when a token
// verifies against none of the keys it holds (a key the provider rotated in), but at
// most once per every: a stream of forged tokens, or of unknown key ids, does not make
// every request fetch the JWKS (go-oidc's RemoteKeySet fetches on each).
type keySet struct {
	url    string
	algs   []jose.SignatureAlgorithm
	client *http.Client
	every  time.Duration
	now    func() time.Time

	mu      sync.Mutex // held while fetching: one fetch at a time
	keys    []jose.JSONWebKey
	fetched time.Time // of the last fetch, whether it succeeded or not
}

// maxJWKS bounds a JWKS document.
const maxJWKS = 1 << 20

// VerifySignature returns the payload of a JWS signed by one of the set's keys.
func (k *keySet) VerifySignature(ctx context.Context, raw string) ([]byte, error) {
	jws, err := jose.ParseSigned(raw, k.algs)
	if err != nil {
		return nil, fmt.Errorf("malformed token: %w", err)
	}
	held, stale := k.held()
	if p, ok := verifyWith(jws, held); ok {
		return p, nil
	}
	if !stale {
		return nil, errors.New("no key of the JWKS verifies the token")
	}
	keys, err := k.refetch(ctx)
	if err != nil {
		return nil, err
	}
	if p, ok := verifyWith(jws, keys); ok {
		return p, nil
	}
	return nil, errors.New("no key of the JWKS verifies the token")
}

// held is the keys held, and whether they may be fetched again.
func (k *keySet) held() (keys []jose.JSONWebKey, stale bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.keys, k.fetched.IsZero() || k.now().Sub(k.fetched) >= k.every
}

// refetch fetches the JWKS, unless another request did within every (then the keys it
// fetched are returned).
func (k *keySet) refetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.fetched.IsZero() && k.now().Sub(k.fetched) < k.every {
		return k.keys, nil
	}
	k.fetched = k.now()
	keys, err := k.fetch(ctx)
	if err != nil {
		return nil, err
	}
	k.keys = keys
	return keys, nil
}

func (k *keySet) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return nil, fmt.Errorf("JWKS request: %w", err)
	}
	res, err := k.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the JWKS: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch the JWKS: %s", res.Status)
	}
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(io.LimitReader(res.Body, maxJWKS)).Decode(&set); err != nil {
		return nil, fmt.Errorf("the JWKS does not decode: %w", err)
	}
	return set.Keys, nil
}

// verifyWith verifies jws with the keys its key id names (all of them when it names
// none).
func verifyWith(jws *jose.JSONWebSignature, keys []jose.JSONWebKey) ([]byte, bool) {
	kid := ""
	if len(jws.Signatures) > 0 {
		kid = jws.Signatures[0].Header.KeyID
	}
	for _, key := range keys {
		if kid != "" && key.KeyID != kid {
			continue
		}
		if p, err := jws.Verify(&key); err == nil {
			return p, true
		}
	}
	return nil, false
}
