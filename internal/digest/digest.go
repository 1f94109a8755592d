// Package digest is extworker's one way to fingerprint what it must not store: the
// SHA-256 of a message body (the outbox's and the inbox's body digests) and of a
// request's canonical JSON (the effect ledger's request digest, idempotency.Digest).
// Both are lower-case hex.
package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// Bytes returns the SHA-256 of b in lower-case hex.
func Bytes(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// JSON returns the SHA-256 of v's canonical JSON: object keys sorted, no insignificant
// space, numbers as written (so precision beyond float64 is kept). A json.RawMessage is
// canonicalised too; invalid JSON is an error.
func JSON(v any) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("digest request: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	var canon any
	if err := dec.Decode(&canon); err != nil {
		return "", fmt.Errorf("digest request: %w", err)
	}
	out, err := json.Marshal(canon) // maps marshal with sorted keys
	if err != nil {
		return "", fmt.Errorf("digest request: %w", err)
	}
	return Bytes(out), nil
}
