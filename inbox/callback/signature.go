package callback

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The Standard Webhooks headers (https://www.standardwebhooks.com).
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// DefaultTolerance is Config.Tolerance's default: how far a callback's timestamp may be
// from the receiver's clock, either way.
const DefaultTolerance = 5 * time.Minute

// secretPrefix marks a Standard Webhooks secret; the base64 key follows it.
const secretPrefix = "whsec_"

// minKeyBytes is the shortest key ParseSecret takes (the scheme asks for 24 to 64 bytes).
const minKeyBytes = 24

// Why a signature is refused: each answered 401, nothing recorded.
var (
	ErrMissingHeaders = errors.New("callback: webhook-id, webhook-timestamp or webhook-signature missing")
	ErrMalformed      = errors.New("callback: webhook-timestamp is not unix seconds")
	ErrStale          = errors.New("callback: webhook-timestamp outside the tolerance window")
	ErrNoMatch        = errors.New("callback: no v1 signature matches a secret of the source")
)

// Secret is one signing key of a source. Its String never shows the key.
type Secret struct{ key []byte }

// ParseSecret reads a secret as the scheme writes it, "whsec_" and the base64 key (the
// prefix may be left out). The key must have at least 24 bytes.
func ParseSecret(s string) (Secret, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(s), secretPrefix))
	if err != nil {
		return Secret{}, errors.New("callback: a secret is whsec_ and a base64 key; this one is not base64")
	}
	if len(key) < minKeyBytes {
		return Secret{}, fmt.Errorf("callback: a secret's key needs at least %d bytes, this one has %d", minKeyBytes, len(key))
	}
	return Secret{key: key}, nil
}

// String hides the key.
func (s Secret) String() string { return secretPrefix + "…" }

// Headers are the three signature headers of one callback, as received.
type Headers struct {
	ID, Timestamp, Signature string
}

// Sign returns the webhook-signature value of a callback with id, timestamp (the
// webhook-timestamp value: unix seconds) and body: "v1," and the base64 HMAC-SHA256 of
// "{id}.{timestamp}.{body}". A sender lists several, space-separated, while it rotates.
func Sign(s Secret, id, timestamp string, body []byte) string {
	return "v1," + base64.StdEncoding.EncodeToString(mac(s, id, timestamp, body))
}

func mac(s Secret, id, timestamp string, body []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(id + "." + timestamp + "."))
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks a callback's signature at now: its headers present, its timestamp within
// tolerance of now (either way: a replay later, or a clock far ahead), and one of its v1
// signatures made with one of secrets (several while they rotate). Each comparison is in
// constant time. Other versions in the header (v1a, say) are skipped. A pure function.
func Verify(secrets []Secret, h Headers, body []byte, now time.Time, tolerance time.Duration) error {
	if h.ID == "" || h.Timestamp == "" || h.Signature == "" {
		return ErrMissingHeaders
	}
	ts, err := strconv.ParseInt(h.Timestamp, 10, 64)
	if err != nil {
		return ErrMalformed
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return ErrStale
	}
	if !anyMatches(secrets, signatures(h.Signature), h, body) {
		return ErrNoMatch
	}
	return nil
}

// signatures decodes the v1 signatures of a webhook-signature value; the rest is skipped.
func signatures(header string) [][]byte {
	var out [][]byte
	for _, f := range strings.Fields(header) {
		version, sig, ok := strings.Cut(f, ",")
		if !ok || version != "v1" {
			continue
		}
		if b, err := base64.StdEncoding.DecodeString(sig); err == nil {
			out = append(out, b)
		}
	}
	return out
}

// anyMatches reports whether a signature is one of the secrets' MACs; every pair is
// compared, in constant time.
func anyMatches(secrets []Secret, sigs [][]byte, h Headers, body []byte) bool {
	ok := false
	for _, s := range secrets {
		want := mac(s, h.ID, h.Timestamp, body)
		for _, sig := range sigs {
			eq := hmac.Equal(want, sig)
			ok = ok || eq
		}
	}
	return ok
}
