package camunda7

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"
)

// FuzzDecodeVariables feeds arbitrary variables objects through
// unmarshalling, Decode and every accessor, which must never panic:
// variables come from the engine, and from whatever process models and
// scripts wrote into them. It also checks invariants between the paths.
func FuzzDecodeVariables(f *testing.F) {
	seeds := []string{
		engineResponse,
		`{}`,
		`null`,
		`{"a":null}`,
		`{"s":{"type":"String","value":"hello","valueInfo":{}}}`,
		`{"s":{"type":"String","value":"Grüße, 東京 🚀 \ud83d\ude80 \u0000","valueInfo":{}}}`,
		`{"b":{"type":"Boolean","value":false,"valueInfo":{}}}`,
		`{"n":{"type":"Short","value":-32768,"valueInfo":{}}}`,
		`{"n":{"type":"Integer","value":-2147483648,"valueInfo":{}}}`,
		`{"n":{"type":"Long","value":9007199254740993,"valueInfo":{}}}`,
		`{"n":{"type":"Long","value":-9223372036854775808,"valueInfo":{}}}`,
		`{"n":{"type":"Long","value":99999999999999999999999999999999999999,"valueInfo":{}}}`,
		`{"n":{"type":"Long","value":"+0012","valueInfo":{}}}`,
		`{"n":{"type":"Long","value":1.0e2,"valueInfo":{}}}`,
		`{"n":{"type":"Long","value":-0,"valueInfo":{}}}`,
		`{"d":{"type":"Double","value":-1.5e-320,"valueInfo":{}}}`,
		`{"d":{"type":"Double","value":1e999,"valueInfo":{}}}`,
		`{"d":{"type":"Double","value":"Infinity","valueInfo":{}}}`,
		`{"t":{"type":"Date","value":"2024-03-01T12:30:45.123+0530","valueInfo":{}}}`,
		`{"t":{"type":"Date","value":"2024-03-01T12:30:45Z","valueInfo":{}}}`,
		`{"t":{"type":"Date","value":"0000-01-01T00:00:00.000-2359","valueInfo":{}}}`,
		`{"x":{"type":"Null","value":null,"valueInfo":{}}}`,
		`{"x":{"type":"Bytes","value":"AAEC/w==","valueInfo":{}}}`,
		`{"f":{"type":"File","value":null,"valueInfo":{"filename":"a.pdf","mimeType":"application/pdf","encoding":"UTF-8"}}}`,
		`{"f":{"type":"File","value":"aGk=","valueInfo":{"filename":"a.txt"}}}`,
		`{"j":{"type":"Json","value":"{\"a\":[1,2,{\"b\":null}]}","valueInfo":{}}}`,
		`{"j":{"type":"Json","value":{"deserialized":true},"valueInfo":{}}}`,
		`{"o":{"type":"Object","value":"{\"k\":\"v\"}","valueInfo":{"objectTypeName":"java.util.LinkedHashMap","serializationDataFormat":"application/json"}}}`,
		`{"o":{"type":"Object","value":"rO0AB","valueInfo":{"objectTypeName":"java.util.HashMap","serializationDataFormat":"application/x-java-serialized-object"}}}`,
		`{"o":{"type":"Object","value":[1],"valueInfo":{"serializationDataFormat":"Application/JSON; charset=utf-8"}}}`,
		`{"x":{"type":"Xml","value":"<a b=\"c\"/>","valueInfo":{}}}`,
		`{"u":{"type":"Foo","value":{"a":1},"valueInfo":{"custom":[1]}}}`,
		`{"u":{"type":"","value":1}}`,
		`{"u":{"value":1}}`,
		`{"u":{"type":"long","value":1,"valueInfo":null}}`,
		`{"u":{"type":"String","value":"x","valueInfo":{"transient":true}}}`,
		`{"u":{"type":1}}`,
		`{"u":[]}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		var vs Variables
		if err := json.Unmarshal(data, &vs); err != nil {
			return
		}
		for name, v := range vs {
			decoded, derr := v.Decode()
			value, verr := vs.Value(name)
			if (derr == nil) != (verr == nil) {
				t.Fatalf("Decode and Value disagree for %q: %v / %v", name, derr, verr)
			}
			checkVariableError(t, derr, "")
			checkVariableError(t, verr, name)
			_, _ = decoded, value

			_, err := vs.String(name)
			checkVariableError(t, err, name)
			_, err = vs.Bool(name)
			checkVariableError(t, err, name)
			_, err = vs.Integer(name)
			checkVariableError(t, err, name)
			_, err = vs.Double(name)
			checkVariableError(t, err, name)
			_, err = vs.Date(name)
			checkVariableError(t, err, name)
			_, err = vs.Bytes(name)
			checkVariableError(t, err, name)
			_, err = vs.File(name)
			checkVariableError(t, err, name)
			var dst any
			err = vs.JSON(name, &dst)
			checkVariableError(t, err, name)
			var typed struct {
				A int      `json:"a"`
				B []string `json:"b"`
			}
			err = vs.JSON(name, &typed)
			checkVariableError(t, err, name)

			n, err := vs.Long(name)
			checkVariableError(t, err, name)
			if err == nil {
				b, merr := json.Marshal(Variables{"n": LongVar(n)})
				if merr != nil {
					t.Fatalf("marshal LongVar(%d): %v", n, merr)
				}
				var back Variables
				if uerr := json.Unmarshal(b, &back); uerr != nil {
					t.Fatalf("unmarshal %s: %v", b, uerr)
				}
				got, lerr := back.Long("n")
				if lerr != nil || got != n {
					t.Fatalf("LongVar(%d) round trip gave %d, %v", n, got, lerr)
				}
			}

			if d, err := vs.Double(name); err == nil && !math.IsNaN(d) && !math.IsInf(d, 0) {
				if _, merr := json.Marshal(DoubleVar(d)); merr != nil {
					t.Fatalf("DoubleVar(%v) does not marshal: %v", d, merr)
				}
			}
			if s, err := vs.String(name); err == nil {
				if _, merr := json.Marshal(StringVar(s)); merr != nil {
					t.Fatalf("StringVar does not marshal: %v", merr)
				}
			}
		}

		// What was read and has a type can be sent back unchanged.
		out, err := json.Marshal(vs)
		if err != nil {
			var ve *VariableError
			if !errors.As(err, &ve) {
				t.Fatalf("marshal error is not a *VariableError: %v", err)
			}
			return
		}
		var again Variables
		if err := json.Unmarshal(out, &again); err != nil {
			t.Fatalf("re-read of %s: %v", out, err)
		}
		if len(again) != len(vs) {
			t.Fatalf("re-read has %d variables, want %d", len(again), len(vs))
		}
	})
}

// checkVariableError fails t unless err is nil or a *VariableError for
// name that wraps exactly one of the sentinels.
func checkVariableError(t *testing.T, err error, name string) {
	t.Helper()
	if err == nil {
		return
	}
	var ve *VariableError
	if !errors.As(err, &ve) {
		t.Fatalf("error is not a *VariableError: %v", err)
	}
	if ve.Name != name {
		t.Fatalf("error names %q, want %q", ve.Name, name)
	}
	var invalid *json.InvalidUnmarshalError
	if errors.As(err, &invalid) {
		return
	}
	count := 0
	for _, s := range []error{ErrVariableMissing, ErrVariableType, ErrVariableNull, ErrVariableValue} {
		if errors.Is(err, s) {
			count++
		}
	}
	if count != 1 {
		t.Fatalf("error wraps %d sentinels: %v", count, err)
	}
	_ = err.Error()
}

// FuzzParseDate checks that ParseDate never panics and that whatever it
// accepts survives FormatDate and ParseDate again as the same instant (to
// the millisecond the engine format keeps) and the same offset.
func FuzzParseDate(f *testing.F) {
	for _, s := range []string{
		"2024-03-01T12:30:45.123+0530",
		"2024-03-01T12:30:45.123-0000",
		"0000-01-01T00:00:00.000+2359",
		"9999-12-31T23:59:59.999-2359",
		"2024-03-01T12:30:45Z",
		"2024-03-01T12:30:45.123456789+02:00",
		"2024-03-01T12:30:45,5+0100",
		"2024-02-29T24:00:00.000+0000",
		"",
		"garbage",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		parsed, err := ParseDate(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		formatted := FormatDate(parsed)
		back, err := ParseDate(formatted)
		if !dateYearOK(parsed) {
			return
		}
		if err != nil {
			t.Fatalf("ParseDate(%q) = %v; FormatDate gave %q which does not parse", s, parsed, formatted)
		}
		want := parsed.Add(-time.Duration(parsed.Nanosecond() % int(time.Millisecond)))
		if !back.Equal(want) {
			t.Fatalf("ParseDate(%q) = %v; round trip via %q gave %v", s, parsed, formatted, back)
		}
		_, off1 := parsed.Zone()
		_, off2 := back.Zone()
		if off1 != off2 {
			t.Fatalf("offset changed from %d to %d via %q", off1, off2, formatted)
		}
		if formatted != FormatDate(back) {
			t.Fatalf("FormatDate not stable: %q vs %q", formatted, FormatDate(back))
		}
	})
}
