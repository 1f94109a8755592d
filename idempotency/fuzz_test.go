package idempotency_test

import (
	"encoding/json"
	"testing"

	"github.com/extworker/extworker/idempotency"
)

// FuzzDigest: the canonical digest never panics, is deterministic, and does not depend
// on how the same JSON value was written (key order, spacing, escapes).
func FuzzDigest(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1,2.5,"x"]}`, `{"a":[1,2.5,"x"],"b":1}`, `[]`, `null`, `"\u00e9"`, `{"n":9007199254740993}`, `{"a":{"c":1,"b":2}}`, `1E700`, `{"x":-1e-400}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !json.Valid([]byte(s)) {
			if _, err := idempotency.Digest(json.RawMessage(s)); err == nil {
				t.Fatalf("invalid JSON digested: %q", s)
			}
			return
		}
		d1, err := idempotency.Digest(json.RawMessage(s))
		if err != nil {
			t.Fatalf("digest of valid JSON %q: %v", s, err)
		}
		d2, err := idempotency.Digest(json.RawMessage(s))
		if err != nil || d1 != d2 {
			t.Fatalf("not deterministic: %s vs %s", d1, d2)
		}
		// A number beyond float64 (1E700) is valid JSON and digests as written; it has no
		// float64 value to re-encode.
		var v any
		if json.Unmarshal([]byte(s), &v) != nil {
			return
		}
		// The same value re-encoded (keys sorted, spacing dropped) digests the same, unless
		// float64 decoding changed a number (precision beyond 2^53 is kept by the digest,
		// not by this re-encoding).
		re, err := json.Marshal(v)
		if err != nil {
			return
		}
		var back any
		if json.Unmarshal(re, &back) != nil {
			return
		}
		reenc, _ := json.Marshal(back)
		if string(reenc) != string(re) {
			return
		}
		d3, err := idempotency.Digest(json.RawMessage(re))
		if err != nil {
			t.Fatalf("digest of re-encoded %q: %v", re, err)
		}
		d4, _ := idempotency.Digest(v)
		if d3 != d4 {
			t.Fatalf("the same value digests differently: %s vs %s for %q", d3, d4, re)
		}
	})
}
