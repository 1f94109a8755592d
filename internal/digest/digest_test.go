package digest_test

import (
	"encoding/json"
	"testing"

	"github.com/extworker/extworker/internal/digest"
)

func TestJSONIgnoresKeyOrderAndSpacing(t *testing.T) {
	a, err := digest.JSON(json.RawMessage(`{"b":1, "a":[1,2.5,"x"]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := digest.JSON(map[string]any{"a": []any{1, 2.5, "x"}, "b": 1})
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("same value, different digests: %s %s", a, b)
	}
	if _, err := digest.JSON(json.RawMessage(`{"a":`)); err == nil {
		t.Fatal("invalid JSON digested")
	}
}

func TestBytesIsSHA256Hex(t *testing.T) {
	if got := digest.Bytes([]byte("abc")); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("Bytes(abc) = %s", got)
	}
}
