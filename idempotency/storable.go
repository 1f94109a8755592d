package idempotency

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Text a provider returns (a decline's code and message, a reference, a reason, an
// error's text, the strings of Result.Values) is recorded as the ledger can store it, the
// same way in every store: PostgreSQL refuses a NUL byte and invalid UTF-8 in text and
// jsonb, and a write it refuses would turn an answer the worker had into a retry or an
// unknown outcome. Each NUL byte and each invalid UTF-8 sequence becomes U+FFFD (�), in
// what is recorded and in what Do returns (the Receipt, a decline's Rejection), on the
// first attempt as on a replay.

// replacement is what a NUL byte or an invalid UTF-8 sequence becomes.
const replacement = "\uFFFD"

// storable returns s with each NUL byte and invalid UTF-8 sequence replaced by U+FFFD.
func storable(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, replacement), "\x00", replacement)
}

// storablePtr is storable of *p, nil for nil.
func storablePtr(p *string) *string {
	if p == nil {
		return nil
	}
	s := storable(*p)
	return &s
}

// storableValues returns values as the ledger stores them: the JSON of values (object
// keys and strings at any depth made storable: encoding/json already replaces invalid
// UTF-8, and a NUL, which jsonb refuses, is replaced here), and values as Do returns
// them: values itself, unless a NUL had to be replaced, then the JSON decoded again
// (numbers as json.Number). A top-level value that cannot be encoded as JSON (a NaN, a
// channel, a json.Number that is no number) is left out, and dropped names each with
// its error: the provider has acted, so the intent is confirmed with what can be stored
// rather than turned into an error.
func storableValues(values map[string]any) (_ map[string]any, _ []byte, dropped []string, err error) {
	b, err := json.Marshal(values)
	if err != nil {
		kept := make(map[string]any, len(values))
		for k, v := range values {
			if _, err := json.Marshal(v); err != nil {
				dropped = append(dropped, fmt.Sprintf("%q (%v)", storable(k), err))
				continue
			}
			kept[k] = v
		}
		sort.Strings(dropped)
		values = kept
		if b, err = json.Marshal(values); err != nil {
			return nil, nil, nil, err
		}
	}
	if !bytes.Contains(b, []byte(`\u0000`)) {
		return values, b, dropped, nil
	}
	var v map[string]any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, nil, nil, err
	}
	v, _ = storableJSON(v).(map[string]any)
	b, err = json.Marshal(v)
	return v, b, dropped, err
}

// decodeValues decodes stored values as Do returns them: objects as map[string]any,
// arrays as []any, numbers as float64, except a number float64 cannot hold (1E700),
// which stays a json.Number rather than failing the replay of a confirmed effect.
func decodeValues(b []byte) (map[string]any, error) {
	var v map[string]any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	m, _ := floats(v).(map[string]any)
	return m, nil
}

// floats turns the json.Numbers in a decoded value into float64 where they fit.
func floats(v any) any {
	switch x := v.(type) {
	case json.Number:
		if f, err := strconv.ParseFloat(string(x), 64); err == nil {
			return f
		}
	case []any:
		for i := range x {
			x[i] = floats(x[i])
		}
	case map[string]any:
		for k, e := range x {
			x[k] = floats(e)
		}
	}
	return v
}

// storableJSON is a decoded JSON value with its keys and strings made storable.
func storableJSON(v any) any {
	switch x := v.(type) {
	case string:
		return storable(x)
	case []any:
		for i := range x {
			x[i] = storableJSON(x[i])
		}
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[storable(k)] = storableJSON(e)
		}
		return m
	}
	return v
}
