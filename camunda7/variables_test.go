package camunda7

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mustVar returns a function that unwraps the constructors returning an
// error, failing t on one.
func mustVar(t *testing.T) func(Variable, error) Variable {
	return func(v Variable, err error) Variable {
		t.Helper()
		require.NoError(t, err)
		return v
	}
}

func TestConstructorsMarshal(t *testing.T) {
	ist := time.FixedZone("IST", 5*3600+30*60)
	pst := time.FixedZone("PST", -8*3600)
	// Amsterdam local mean time: an offset with seconds, which the layout
	// cannot express; the instant must survive by switching to UTC.
	lmt := time.FixedZone("LMT", 19*60+32)
	must := mustVar(t)

	tests := []struct {
		name string
		v    Variable
		want string
	}{
		{"string", StringVar("hello"), `{"type":"String","value":"hello","valueInfo":{}}`},
		{"string empty", StringVar(""), `{"type":"String","value":"","valueInfo":{}}`},
		{"string unicode", StringVar("Grüße, 東京 🚀"), `{"type":"String","value":"Grüße, 東京 🚀","valueInfo":{}}`},
		{"string escapes", StringVar("a\"b\\c\nd"), `{"type":"String","value":"a\"b\\c\nd","valueInfo":{}}`},
		{"bool true", BoolVar(true), `{"type":"Boolean","value":true,"valueInfo":{}}`},
		{"bool false", BoolVar(false), `{"type":"Boolean","value":false,"valueInfo":{}}`},
		{"short min", ShortVar(math.MinInt16), `{"type":"Short","value":-32768,"valueInfo":{}}`},
		{"integer max", IntegerVar(math.MaxInt32), `{"type":"Integer","value":2147483647,"valueInfo":{}}`},
		{"long beyond 2^53", LongVar(9007199254740993), `{"type":"Long","value":9007199254740993,"valueInfo":{}}`},
		{"long max", LongVar(math.MaxInt64), `{"type":"Long","value":9223372036854775807,"valueInfo":{}}`},
		{"long min", LongVar(math.MinInt64), `{"type":"Long","value":-9223372036854775808,"valueInfo":{}}`},
		{"double", DoubleVar(1.5), `{"type":"Double","value":1.5,"valueInfo":{}}`},
		{"double whole", DoubleVar(3), `{"type":"Double","value":3,"valueInfo":{}}`},
		{"double tiny", DoubleVar(0.1), `{"type":"Double","value":0.1,"valueInfo":{}}`},
		{"double huge", DoubleVar(1e21), `{"type":"Double","value":1e+21,"valueInfo":{}}`},
		{"double max", DoubleVar(math.MaxFloat64), `{"type":"Double","value":1.7976931348623157e+308,"valueInfo":{}}`},
		{"date +0530", DateVar(time.Date(2024, 3, 1, 12, 30, 45, 123456789, ist)),
			`{"type":"Date","value":"2024-03-01T12:30:45.123+0530","valueInfo":{}}`},
		{"date UTC", DateVar(time.Date(2024, 12, 31, 23, 59, 59, 0, time.UTC)),
			`{"type":"Date","value":"2024-12-31T23:59:59.000+0000","valueInfo":{}}`},
		{"date -0800", DateVar(time.Date(2000, 1, 2, 3, 4, 5, 6e6, pst)),
			`{"type":"Date","value":"2000-01-02T03:04:05.006-0800","valueInfo":{}}`},
		{"date offset with seconds", DateVar(time.Date(1900, 1, 1, 0, 19, 32, 0, lmt)),
			`{"type":"Date","value":"1900-01-01T00:00:00.000+0000","valueInfo":{}}`},
		{"null", NullVar(), `{"type":"Null","value":null,"valueInfo":{}}`},
		{"bytes", BytesVar([]byte{0, 1, 2, 0xff}), `{"type":"Bytes","value":"AAEC/w==","valueInfo":{}}`},
		{"bytes empty", BytesVar(nil), `{"type":"Bytes","value":"","valueInfo":{}}`},
		{"json", must(JSONVar(map[string]any{"a": 1, "b": []string{"x"}})),
			`{"type":"Json","value":"{\"a\":1,\"b\":[\"x\"]}","valueInfo":{}}`},
		{"json raw kept as given", must(JSONRawVar([]byte(`{"b": [1, 2]}`))),
			`{"type":"Json","value":"{\"b\": [1, 2]}","valueInfo":{}}`},
		{"json scalar", must(JSONVar("x")), `{"type":"Json","value":"\"x\"","valueInfo":{}}`},
		// encoding/json escapes <, > and & in all output; the engine reads them back unchanged.
		{"xml", XMLVar("<a>1</a>"), `{"type":"Xml","value":"\u003ca\u003e1\u003c/a\u003e","valueInfo":{}}`},
		{"object", must(ObjectVar("java.util.LinkedHashMap", map[string]any{"k": "v", "n": 9007199254740993})),
			`{"type":"Object","value":"{\"k\":\"v\",\"n\":9007199254740993}","valueInfo":{"objectTypeName":"java.util.LinkedHashMap","serializationDataFormat":"application/json"}}`},
		{"object list", must(ObjectVar("java.util.ArrayList", []int{1, 2})),
			`{"type":"Object","value":"[1,2]","valueInfo":{"objectTypeName":"java.util.ArrayList","serializationDataFormat":"application/json"}}`},
		{"file", FileVar("a.txt", "text/plain", "UTF-8", []byte("hi")),
			`{"type":"File","value":"aGk=","valueInfo":{"filename":"a.txt","mimeType":"text/plain","encoding":"UTF-8"}}`},
		{"file only filename", FileVar("blob", "", "", nil),
			`{"type":"File","value":"","valueInfo":{"filename":"blob"}}`},
		{"transient", StringVar("x").WithTransient(), `{"type":"String","value":"x","valueInfo":{"transient":true}}`},
		{"transient object", must(ObjectVar("java.util.HashMap", map[string]int{})).WithTransient(),
			`{"type":"Object","value":"{}","valueInfo":{"objectTypeName":"java.util.HashMap","serializationDataFormat":"application/json","transient":true}}`},
		{"literal nil value", Variable{Type: TypeLong}, `{"type":"Long","value":null,"valueInfo":{}}`},
		{"literal empty value", Variable{Type: TypeString, Value: json.RawMessage{}}, `{"type":"String","value":null,"valueInfo":{}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := json.Marshal(tt.v)
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(got))

			// Inside Variables the same text appears under the name.
			got, err = json.Marshal(Variables{"v": tt.v})
			require.NoError(t, err)
			assert.Equal(t, `{"v":`+tt.want+`}`, string(got))
		})
	}
}

func TestWithTransientDoesNotModifyOriginal(t *testing.T) {
	v := StringVar("x")
	tv := v.WithTransient()
	assert.False(t, v.ValueInfo.Transient)
	assert.True(t, tv.ValueInfo.Transient)
}

func TestVariablesMarshal(t *testing.T) {
	got, err := json.Marshal(Variables{"b": LongVar(2), "a": StringVar("x")})
	require.NoError(t, err)
	assert.Equal(t, `{"a":{"type":"String","value":"x","valueInfo":{}},"b":{"type":"Long","value":2,"valueInfo":{}}}`, string(got))

	got, err = json.Marshal(Variables(nil))
	require.NoError(t, err)
	assert.Equal(t, `null`, string(got))

	got, err = json.Marshal(Variables{})
	require.NoError(t, err)
	assert.Equal(t, `{}`, string(got))

	// As a request field with omitempty, nil and empty are left out.
	type req struct {
		Variables Variables `json:"variables,omitempty"`
	}
	got, err = json.Marshal(req{})
	require.NoError(t, err)
	assert.Equal(t, `{}`, string(got))
}

func TestMarshalFailsBeforeSending(t *testing.T) {
	tests := []struct {
		name     string
		v        Variable
		sentinel error
		contains string
	}{
		{"NaN", DoubleVar(math.NaN()), ErrVariableValue, "NaN"},
		{"+Inf", DoubleVar(math.Inf(1)), ErrVariableValue, "infinite"},
		{"-Inf", DoubleVar(math.Inf(-1)), ErrVariableValue, "infinite"},
		{"file without name", FileVar("", "text/plain", "", []byte("x")), ErrVariableValue, "filename"},
		{"date year 10000", DateVar(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)), ErrVariableValue, "year"},
		{"date year -1", DateVar(time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)), ErrVariableValue, "year"},
		{"no type", Variable{Value: json.RawMessage(`1`)}, ErrVariableType, "explicit type"},
		{"zero variable", Variable{}, ErrVariableType, "explicit type"},
		{"invalid JSON value", Variable{Type: TypeLong, Value: json.RawMessage(`1.2.3`)}, ErrVariableValue, "not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := json.Marshal(Variables{"amount": StringVar("ok"), "bad": tt.v})
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.sentinel)
			var ve *VariableError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, "bad", ve.Name)
			assert.Contains(t, err.Error(), `variable "bad"`)
			assert.Contains(t, err.Error(), tt.contains)

			// On its own, the variable fails the same way, without a name.
			_, err = json.Marshal(tt.v)
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.sentinel)
			require.ErrorAs(t, err, &ve)
			assert.Empty(t, ve.Name)

			// And inside a request struct.
			_, err = json.Marshal(struct {
				Variables Variables `json:"variables"`
			}{Variables{"bad": tt.v}})
			require.ErrorIs(t, err, tt.sentinel)
		})
	}
}

// unencodable fails to marshal with an error that quotes a secret.
type unencodable struct{ secret string }

func (u unencodable) MarshalJSON() ([]byte, error) {
	return nil, errors.New("cannot encode " + u.secret)
}

func TestConstructorErrors(t *testing.T) {
	tests := []struct {
		name string
		fn   func() (Variable, error)
	}{
		{"JSONVar chan", func() (Variable, error) { return JSONVar(make(chan int)) }},
		{"JSONVar NaN", func() (Variable, error) { return JSONVar(math.NaN()) }},
		{"JSONVar marshaler error", func() (Variable, error) { return JSONVar(unencodable{"s3cr3t"}) }},
		{"JSONRawVar invalid", func() (Variable, error) { return JSONRawVar([]byte(`{"a":`)) }},
		{"JSONRawVar empty", func() (Variable, error) { return JSONRawVar(nil) }},
		{"ObjectVar no type name", func() (Variable, error) { return ObjectVar("", map[string]int{}) }},
		{"ObjectVar unencodable", func() (Variable, error) { return ObjectVar("java.util.HashMap", unencodable{"s3cr3t"}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := tt.fn()
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrVariableValue)
			var ve *VariableError
			assert.ErrorAs(t, err, &ve)
			assert.NotContains(t, err.Error(), "s3cr3t")
			assert.Empty(t, v.Type)
		})
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	ist := time.FixedZone("", 5*3600+30*60)
	date := time.Date(2024, 3, 1, 12, 30, 45, 123e6, ist)
	must := mustVar(t)
	tests := []struct {
		name string
		v    Variable
		want any
	}{
		{"string", StringVar("hello"), "hello"},
		{"string unicode", StringVar("Grüße, 東京 🚀"), "Grüße, 東京 🚀"},
		{"string control chars", StringVar("tab\there\x00nul"), "tab\there\x00nul"},
		{"bool", BoolVar(true), true},
		{"short", ShortVar(-32768), int16(-32768)},
		{"integer", IntegerVar(math.MinInt32), int32(math.MinInt32)},
		{"long 2^53+1", LongVar(9007199254740993), int64(9007199254740993)},
		{"long max", LongVar(math.MaxInt64), int64(math.MaxInt64)},
		{"long min", LongVar(math.MinInt64), int64(math.MinInt64)},
		{"double", DoubleVar(-2.5e-300), -2.5e-300},
		{"double max", DoubleVar(math.MaxFloat64), math.MaxFloat64},
		{"null", NullVar(), nil},
		{"bytes", BytesVar([]byte{0, 0xfe, 0xff}), []byte{0, 0xfe, 0xff}},
		{"bytes empty", BytesVar(nil), []byte{}},
		{"json", must(JSONVar(map[string]any{"a": []int{1}})), json.RawMessage(`{"a":[1]}`)},
		{"json raw", must(JSONRawVar([]byte(` [1, "ü"] `))), json.RawMessage(` [1, "ü"] `)},
		{"xml", XMLVar("<a>ü</a>"), "<a>ü</a>"},
		{"object", must(ObjectVar("java.util.LinkedHashMap", map[string]int64{"n": math.MaxInt64})),
			json.RawMessage(`{"n":9223372036854775807}`)},
		{"file", FileVar("r.pdf", "application/pdf", "", []byte("%PDF")),
			FileValue{Filename: "r.pdf", MimeType: "application/pdf", Content: []byte("%PDF")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(Variables{"v": tt.v})
			require.NoError(t, err)
			var vs Variables
			require.NoError(t, json.Unmarshal(b, &vs))
			got, err := vs["v"].Decode()
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)

			got, err = vs.Value("v")
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}

	t.Run("date", func(t *testing.T) {
		b, err := json.Marshal(Variables{"d": DateVar(date)})
		require.NoError(t, err)
		var vs Variables
		require.NoError(t, json.Unmarshal(b, &vs))
		got, err := vs["d"].Decode()
		require.NoError(t, err)
		require.IsType(t, time.Time{}, got)
		assert.True(t, date.Equal(got.(time.Time)), "got %v", got)
		_, off := got.(time.Time).Zone()
		assert.Equal(t, 5*3600+30*60, off, "the printed offset is kept")
	})
}

// engineResponse is a variables object as fetchAndLock returns it
// (deserializeValues=false), one variable of every type and then some.
const engineResponse = `{
	"str":      {"type":"String","value":"Grüße, 東京 🚀","valueInfo":{}},
	"xml":      {"type":"Xml","value":"<a/>","valueInfo":{}},
	"flag":     {"type":"Boolean","value":true,"valueInfo":{}},
	"short":    {"type":"Short","value":-7,"valueInfo":{}},
	"int":      {"type":"Integer","value":2147483647,"valueInfo":{}},
	"long":     {"type":"Long","value":9007199254740993,"valueInfo":{}},
	"longMax":  {"type":"Long","value":9223372036854775807,"valueInfo":{}},
	"longMin":  {"type":"Long","value":-9223372036854775808,"valueInfo":{}},
	"longSmall":{"type":"Long","value":42,"valueInfo":{}},
	"longStr":  {"type":"Long","value":"-123","valueInfo":{}},
	"dbl":      {"type":"Double","value":2.5,"valueInfo":{}},
	"dblInt":   {"type":"Double","value":7,"valueInfo":{}},
	"dblNaN":   {"type":"Double","value":"NaN","valueInfo":{}},
	"dblInf":   {"type":"Double","value":"-Infinity","valueInfo":{}},
	"date":     {"type":"Date","value":"2024-03-01T08:00:00.000+0100","valueInfo":{}},
	"null":     {"type":"Null","value":null,"valueInfo":{}},
	"nullStr":  {"type":"String","value":null,"valueInfo":{}},
	"bytes":    {"type":"Bytes","value":"AAEC/w==","valueInfo":{}},
	"bytesRaw": {"type":"Bytes","value":"AAEC/w","valueInfo":{}},
	"file":     {"type":"File","value":null,"valueInfo":{"filename":"r.pdf","mimeType":"application/pdf","encoding":"UTF-8"}},
	"json":     {"type":"Json","value":"{\"order\":{\"id\":9007199254740993,\"items\":[\"a\"]}}","valueInfo":{}},
	"obj":      {"type":"Object","value":"{\"id\":5,\"name\":\"x\"}","valueInfo":{"objectTypeName":"java.util.LinkedHashMap","serializationDataFormat":"application/json"}},
	"objDeser": {"type":"Object","value":{"id":6,"name":"y"},"valueInfo":{"objectTypeName":"java.util.LinkedHashMap","serializationDataFormat":"application/json"}},
	"objJava":  {"type":"Object","value":"rO0ABXNyABFqYXZhLnV0aWwuSGFzaE1hcA==","valueInfo":{"objectTypeName":"java.util.HashMap","serializationDataFormat":"application/x-java-serialized-object"}},
	"foo":      {"type":"Foo","value":{"any":"thing"},"valueInfo":{"custom":1}},
	"lower":    {"type":"long","value":5,"valueInfo":{}},
	"noInfo":   {"type":"String","value":"a"},
	"nullInfo": {"type":"Integer","value":3,"valueInfo":null},
	"noValue":  {"type":"String","valueInfo":{}},
	"trans":    {"type":"String","value":"t","valueInfo":{"transient":true}}
}`

func decodeResponse(t *testing.T) Variables {
	t.Helper()
	var vs Variables
	require.NoError(t, json.Unmarshal([]byte(engineResponse), &vs))
	return vs
}

func TestAccessors(t *testing.T) {
	vs := decodeResponse(t)

	t.Run("String", func(t *testing.T) {
		s, err := vs.String("str")
		require.NoError(t, err)
		assert.Equal(t, "Grüße, 東京 🚀", s)
		s, err = vs.String("xml")
		require.NoError(t, err)
		assert.Equal(t, "<a/>", s)
		s, err = vs.String("noInfo")
		require.NoError(t, err)
		assert.Equal(t, "a", s)
	})
	t.Run("Bool", func(t *testing.T) {
		b, err := vs.Bool("flag")
		require.NoError(t, err)
		assert.True(t, b)
	})
	t.Run("Long", func(t *testing.T) {
		for name, want := range map[string]int64{
			"short": -7, "int": math.MaxInt32, "long": 9007199254740993,
			"longMax": math.MaxInt64, "longMin": math.MinInt64, "longStr": -123, "lower": 5,
		} {
			n, err := vs.Long(name)
			require.NoError(t, err, name)
			assert.Equal(t, want, n, name)
		}
	})
	t.Run("Integer", func(t *testing.T) {
		for name, want := range map[string]int32{"short": -7, "int": math.MaxInt32, "longSmall": 42, "nullInfo": 3} {
			n, err := vs.Integer(name)
			require.NoError(t, err, name)
			assert.Equal(t, want, n, name)
		}
	})
	t.Run("Double", func(t *testing.T) {
		for name, want := range map[string]float64{"dbl": 2.5, "dblInt": 7, "short": -7, "int": math.MaxInt32, "longSmall": 42} {
			f, err := vs.Double(name)
			require.NoError(t, err, name)
			assert.Equal(t, want, f, name)
		}
		f, err := vs.Double("dblNaN")
		require.NoError(t, err)
		assert.True(t, math.IsNaN(f))
		f, err = vs.Double("dblInf")
		require.NoError(t, err)
		assert.True(t, math.IsInf(f, -1))
	})
	t.Run("Date", func(t *testing.T) {
		d, err := vs.Date("date")
		require.NoError(t, err)
		assert.True(t, d.Equal(time.Date(2024, 3, 1, 7, 0, 0, 0, time.UTC)), "got %v", d)
	})
	t.Run("Bytes", func(t *testing.T) {
		for _, name := range []string{"bytes", "bytesRaw"} {
			b, err := vs.Bytes(name)
			require.NoError(t, err, name)
			assert.Equal(t, []byte{0, 1, 2, 0xff}, b, name)
		}
	})
	t.Run("File", func(t *testing.T) {
		f, err := vs.File("file")
		require.NoError(t, err)
		assert.Equal(t, FileValue{Filename: "r.pdf", MimeType: "application/pdf", Encoding: "UTF-8"}, f)
		v, err := vs.Value("file")
		require.NoError(t, err)
		assert.Equal(t, f, v)
	})
	t.Run("JSON", func(t *testing.T) {
		var doc struct {
			Order struct {
				ID    int64    `json:"id"`
				Items []string `json:"items"`
			} `json:"order"`
		}
		require.NoError(t, vs.JSON("json", &doc))
		assert.Equal(t, int64(9007199254740993), doc.Order.ID)
		assert.Equal(t, []string{"a"}, doc.Order.Items)

		var obj struct {
			ID   int    `json:"id"`
			Name string `json:"name"`
		}
		require.NoError(t, vs.JSON("obj", &obj))
		assert.Equal(t, 5, obj.ID)
		assert.Equal(t, "x", obj.Name)

		require.NoError(t, vs.JSON("objDeser", &obj))
		assert.Equal(t, 6, obj.ID)
		assert.Equal(t, "y", obj.Name)

		raw, err := vs.Value("obj")
		require.NoError(t, err)
		assert.Equal(t, json.RawMessage(`{"id":5,"name":"x"}`), raw)
	})
	t.Run("Has", func(t *testing.T) {
		assert.True(t, vs.Has("null"))
		assert.True(t, vs.Has("foo"))
		assert.False(t, vs.Has("nope"))
		assert.False(t, Variables(nil).Has("x"))
	})
	t.Run("Value", func(t *testing.T) {
		for name, want := range map[string]any{
			"null": nil, "nullStr": nil, "noValue": nil, "short": int16(-7), "int": int32(math.MaxInt32),
			"long": int64(9007199254740993), "longStr": int64(-123), "flag": true, "xml": "<a/>",
		} {
			got, err := vs.Value(name)
			require.NoError(t, err, name)
			assert.Equal(t, want, got, name)
		}
	})
	t.Run("lenient unmarshal", func(t *testing.T) {
		assert.Equal(t, "Foo", vs["foo"].Type)
		assert.JSONEq(t, `{"any":"thing"}`, string(vs["foo"].Value))
		assert.Equal(t, ValueInfo{}, vs["noInfo"].ValueInfo)
		assert.Equal(t, ValueInfo{}, vs["nullInfo"].ValueInfo)
		assert.True(t, vs["trans"].ValueInfo.Transient)
		assert.Equal(t, ValueInfo{ObjectTypeName: "java.util.HashMap", SerializationDataFormat: "application/x-java-serialized-object"},
			vs["objJava"].ValueInfo)
	})
}

// accessor calls one accessor, keeping only its error.
type accessor struct {
	name string
	call func(vs Variables, name string) error
}

var accessors = []accessor{
	{"String", func(vs Variables, n string) error { _, err := vs.String(n); return err }},
	{"Bool", func(vs Variables, n string) error { _, err := vs.Bool(n); return err }},
	{"Long", func(vs Variables, n string) error { _, err := vs.Long(n); return err }},
	{"Integer", func(vs Variables, n string) error { _, err := vs.Integer(n); return err }},
	{"Double", func(vs Variables, n string) error { _, err := vs.Double(n); return err }},
	{"Date", func(vs Variables, n string) error { _, err := vs.Date(n); return err }},
	{"Bytes", func(vs Variables, n string) error { _, err := vs.Bytes(n); return err }},
	{"JSON", func(vs Variables, n string) error { var dst any; return vs.JSON(n, &dst) }},
	{"File", func(vs Variables, n string) error { _, err := vs.File(n); return err }},
	{"Value", func(vs Variables, n string) error { _, err := vs.Value(n); return err }},
}

func accessorNamed(t *testing.T, name string) accessor {
	t.Helper()
	for _, a := range accessors {
		if a.name == name {
			return a
		}
	}
	t.Fatalf("no accessor %s", name)
	return accessor{}
}

func TestAccessorErrors(t *testing.T) {
	vs := decodeResponse(t)
	extra := map[string]string{
		"longFrac":      `{"type":"Long","value":1.5,"valueInfo":{}}`,
		"longExp":       `{"type":"Long","value":1e3,"valueInfo":{}}`,
		"longDotZero":   `{"type":"Long","value":10.0,"valueInfo":{}}`,
		"longStrFrac":   `{"type":"Long","value":"1.5","valueInfo":{}}`,
		"longStrSpace":  `{"type":"Long","value":" 15","valueInfo":{}}`,
		"longOver":      `{"type":"Long","value":9223372036854775808,"valueInfo":{}}`,
		"longUnder":     `{"type":"Long","value":-9223372036854775809,"valueInfo":{}}`,
		"longBool":      `{"type":"Long","value":true,"valueInfo":{}}`,
		"intOver":       `{"type":"Integer","value":2147483648,"valueInfo":{}}`,
		"shortOver":     `{"type":"Short","value":32768,"valueInfo":{}}`,
		"longBig":       `{"type":"Long","value":2147483648,"valueInfo":{}}`,
		"boolStr":       `{"type":"Boolean","value":"true","valueInfo":{}}`,
		"strNum":        `{"type":"String","value":12,"valueInfo":{}}`,
		"dblStr":        `{"type":"Double","value":"abc","valueInfo":{}}`,
		"dblOver":       `{"type":"Double","value":1e400,"valueInfo":{}}`,
		"dateBad":       `{"type":"Date","value":"01.03.2024","valueInfo":{}}`,
		"dateNum":       `{"type":"Date","value":1709280000000,"valueInfo":{}}`,
		"bytesBad":      `{"type":"Bytes","value":"not base64!","valueInfo":{}}`,
		"jsonBad":       `{"type":"Json","value":"{not json","valueInfo":{}}`,
		"objBad":        `{"type":"Object","value":"{\"a\":","valueInfo":{"serializationDataFormat":"application/json"}}`,
		"fileBad":       `{"type":"File","value":"%%%","valueInfo":{"filename":"x"}}`,
		"nullLong":      `{"type":"Long","value":null,"valueInfo":{}}`,
		"nullJSON":      `{"type":"Json","value":null,"valueInfo":{}}`,
		"nullBytes":     `{"type":"Bytes","valueInfo":{}}`,
		"objNoFormat":   `{"type":"Object","value":"{}","valueInfo":{"objectTypeName":"x.Y"}}`,
		"objXMLFormat":  `{"type":"Object","value":"<a/>","valueInfo":{"serializationDataFormat":"application/xml"}}`,
		"emptyTypeName": `{"value":1}`,
	}
	for name, raw := range extra {
		var v Variable
		require.NoError(t, json.Unmarshal([]byte(raw), &v), name)
		vs[name] = v
	}

	tests := []struct {
		variable string
		accessor string
		sentinel error
	}{
		// Missing.
		{"nope", "String", ErrVariableMissing},
		{"nope", "Long", ErrVariableMissing},
		{"nope", "File", ErrVariableMissing},
		{"nope", "JSON", ErrVariableMissing},
		{"nope", "Value", ErrVariableMissing},
		// Wrong type.
		{"str", "Long", ErrVariableType},
		{"str", "Bool", ErrVariableType},
		{"str", "JSON", ErrVariableType},
		{"long", "String", ErrVariableType},
		{"dbl", "Long", ErrVariableType},
		{"dbl", "Integer", ErrVariableType},
		{"flag", "Double", ErrVariableType},
		{"json", "String", ErrVariableType},
		{"bytes", "File", ErrVariableType},
		{"file", "Bytes", ErrVariableType},
		{"date", "String", ErrVariableType},
		{"xml", "JSON", ErrVariableType},
		{"objJava", "JSON", ErrVariableType},
		{"objJava", "Value", ErrVariableType},
		{"objNoFormat", "JSON", ErrVariableType},
		{"objXMLFormat", "JSON", ErrVariableType},
		// Unknown types.
		{"foo", "Value", ErrVariableType},
		{"foo", "String", ErrVariableType},
		{"foo", "JSON", ErrVariableType},
		{"foo", "File", ErrVariableType},
		{"emptyTypeName", "Long", ErrVariableType},
		{"emptyTypeName", "Value", ErrVariableType},
		// Null.
		{"null", "String", ErrVariableNull},
		{"null", "Long", ErrVariableNull},
		{"null", "File", ErrVariableNull},
		{"null", "JSON", ErrVariableNull},
		{"nullStr", "String", ErrVariableNull},
		{"noValue", "String", ErrVariableNull},
		{"nullLong", "Long", ErrVariableNull},
		{"nullLong", "Double", ErrVariableNull},
		{"nullJSON", "JSON", ErrVariableNull},
		{"nullBytes", "Bytes", ErrVariableNull},
		// Malformed.
		{"longFrac", "Long", ErrVariableValue},
		{"longFrac", "Value", ErrVariableValue},
		{"longExp", "Long", ErrVariableValue},
		{"longDotZero", "Long", ErrVariableValue},
		{"longStrFrac", "Long", ErrVariableValue},
		{"longStrSpace", "Long", ErrVariableValue},
		{"longOver", "Long", ErrVariableValue},
		{"longOver", "Double", ErrVariableValue},
		{"longUnder", "Long", ErrVariableValue},
		{"longBool", "Long", ErrVariableValue},
		{"intOver", "Long", ErrVariableValue},
		{"intOver", "Value", ErrVariableValue},
		{"shortOver", "Integer", ErrVariableValue},
		{"longBig", "Integer", ErrVariableValue},
		{"longMax", "Integer", ErrVariableValue},
		{"boolStr", "Bool", ErrVariableValue},
		{"strNum", "String", ErrVariableValue},
		{"dblStr", "Double", ErrVariableValue},
		{"dblOver", "Double", ErrVariableValue},
		{"dateBad", "Date", ErrVariableValue},
		{"dateNum", "Date", ErrVariableValue},
		{"bytesBad", "Bytes", ErrVariableValue},
		{"bytesBad", "Value", ErrVariableValue},
		{"jsonBad", "JSON", ErrVariableValue},
		{"jsonBad", "Value", ErrVariableValue},
		{"objBad", "JSON", ErrVariableValue},
		{"fileBad", "File", ErrVariableValue},
		{"fileBad", "Value", ErrVariableValue},
	}
	sentinels := []error{ErrVariableMissing, ErrVariableType, ErrVariableNull, ErrVariableValue}
	for _, tt := range tests {
		t.Run(tt.variable+"/"+tt.accessor, func(t *testing.T) {
			err := accessorNamed(t, tt.accessor).call(vs, tt.variable)
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.sentinel)
			for _, other := range sentinels {
				if other != tt.sentinel {
					assert.NotErrorIs(t, err, other)
				}
			}
			var ve *VariableError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, tt.variable, ve.Name)
			assert.Equal(t, vs[tt.variable].Type, ve.Type)
			assert.Contains(t, err.Error(), `camunda7: variable "`+tt.variable+`"`)

			if v, ok := vs[tt.variable]; ok && tt.accessor == "Value" {
				_, derr := v.Decode()
				assert.ErrorIs(t, derr, tt.sentinel)
				require.ErrorAs(t, derr, &ve)
				assert.Empty(t, ve.Name)
			}
		})
	}
}

func TestJSONIntoWrongDestination(t *testing.T) {
	vs := decodeResponse(t)
	var n int
	err := vs.JSON("json", &n)
	require.ErrorIs(t, err, ErrVariableValue)
	var typeErr *json.UnmarshalTypeError
	require.ErrorAs(t, err, &typeErr, "the encoding/json cause stays reachable")
	assert.Equal(t, `camunda7: variable "json" (type Json): variable value malformed: cannot decode a JSON object into Go type int`, err.Error())

	var dst struct {
		Order struct {
			ID string `json:"id"`
		} `json:"order"`
	}
	err = vs.JSON("json", &dst)
	require.ErrorIs(t, err, ErrVariableValue)
	assert.Equal(t, `camunda7: variable "json" (type Json): variable value malformed: cannot decode a JSON number into Go type string at field order.id`, err.Error())

	// A nil or non-pointer destination is the caller's bug, reported as such.
	err = vs.JSON("json", nil)
	var invalid *json.InvalidUnmarshalError
	require.ErrorAs(t, err, &invalid)
	var ve *VariableError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "json", ve.Name)
}

func TestVariableErrorMessages(t *testing.T) {
	vs := Variables{
		"amount": StringVar("12.50"),
		"count":  Variable{Type: TypeLong, Value: json.RawMessage(`1.5`)},
		"gone":   NullVar(),
		"empty":  Variable{Type: TypeLong},
		"odd":    Variable{Type: "Foo Bar\n", Value: json.RawMessage(`1`)},
		"obj":    Variable{Type: TypeObject, Value: json.RawMessage(`"x"`), ValueInfo: ValueInfo{SerializationDataFormat: "application/x-java-serialized-object"}},
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"wrong type", func() error { _, err := vs.Long("amount"); return err }(),
			`camunda7: variable "amount": has type String, want Long`},
		{"missing", func() error { _, err := vs.Long("nope"); return err }(),
			`camunda7: variable "nope": missing`},
		{"null type", func() error { _, err := vs.String("gone"); return err }(),
			`camunda7: variable "gone" (type Null): variable is null`},
		{"null value", func() error { _, err := vs.Long("empty"); return err }(),
			`camunda7: variable "empty" (type Long): variable is null`},
		{"malformed", func() error { _, err := vs.Long("count"); return err }(),
			`camunda7: variable "count" (type Long): variable value malformed: value is not an integer`},
		{"unknown type", func() error { _, err := vs.Value("odd"); return err }(),
			`camunda7: variable "odd": has type "Foo Bar\n": unknown type`},
		{"object format", func() error { return vs.JSON("obj", new(any)) }(),
			`camunda7: variable "obj": has type Object, want Json: Object serialization format "application/x-java-serialized-object" is not application/json`},
		{"decode without name", func() error { _, err := vs["count"].Decode(); return err }(),
			`camunda7: variable (type Long): variable value malformed: value is not an integer`},
		{"decode unknown type without name", func() error { _, err := vs["odd"].Decode(); return err }(),
			`camunda7: variable has type "Foo Bar\n": unknown type`},
		{"marshal NaN", func() error { _, err := Variables{"ratio": DoubleVar(math.NaN())}.MarshalJSON(); return err }(),
			`camunda7: variable "ratio" (type Double): variable value malformed: Double is NaN or infinite, which JSON cannot carry`},
		{"marshal no type", func() error { _, err := Variables{"x": {}}.MarshalJSON(); return err }(),
			`camunda7: variable "x": has type "": no type set; the engine needs an explicit type`},
		{"nil Err", &VariableError{Name: "n", Type: "Long"}, `camunda7: variable "n" (type Long)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Error(t, tt.err)
			assert.Equal(t, tt.want, tt.err.Error())
		})
	}
}

// TestErrorsNeverContainValues plants a secret in malformed variables and
// checks that no error of any accessor, Decode, marshalling or parsing
// repeats it: variable values may be passwords or personal data, and
// errors end up in logs and incident messages.
func TestErrorsNeverContainValues(t *testing.T) {
	const secret = "s3cr3t"
	const secretNum = "987654321"
	response := `{
		"long":      {"type":"Long","value":"s3cr3t","valueInfo":{}},
		"longNum":   {"type":"Long","value":"987654321.5","valueInfo":{}},
		"longBig":   {"type":"Long","value":98765432198765432198765,"valueInfo":{}},
		"longObj":   {"type":"Long","value":{"pw":"s3cr3t"},"valueInfo":{}},
		"int":       {"type":"Integer","value":"s3cr3t-987654321","valueInfo":{}},
		"short":     {"type":"Short","value":987654321,"valueInfo":{}},
		"dbl":       {"type":"Double","value":"s3cr3t","valueInfo":{}},
		"dblBig":    {"type":"Double","value":9.87654321e987654321,"valueInfo":{}},
		"bool":      {"type":"Boolean","value":"s3cr3t","valueInfo":{}},
		"str":       {"type":"String","value":987654321,"valueInfo":{}},
		"strObj":    {"type":"String","value":["s3cr3t"],"valueInfo":{}},
		"date":      {"type":"Date","value":"s3cr3t","valueInfo":{}},
		"dateNear":  {"type":"Date","value":"2024-01-01T00:00:00.000+s3cr3t","valueInfo":{}},
		"bytes":     {"type":"Bytes","value":"s3cr3t!!","valueInfo":{}},
		"file":      {"type":"File","value":"s3cr3t!!","valueInfo":{"filename":"x"}},
		"json":      {"type":"Json","value":"{\"pw\":\"s3cr3t\"","valueInfo":{}},
		"jsonValid": {"type":"Json","value":"{\"pw\":\"s3cr3t\",\"pin\":987654321}","valueInfo":{}},
		"obj":       {"type":"Object","value":"s3cr3t","valueInfo":{"serializationDataFormat":"application/json"}},
		"objValid":  {"type":"Object","value":"[\"s3cr3t\",987654321]","valueInfo":{"serializationDataFormat":"application/json"}},
		"objJava":   {"type":"Object","value":"s3cr3t","valueInfo":{"serializationDataFormat":"application/x-java-serialized-object"}},
		"unknown":   {"type":"Secretive","value":"s3cr3t","valueInfo":{}}
	}`
	var vs Variables
	require.NoError(t, json.Unmarshal([]byte(response), &vs))

	var errs []error
	for name, v := range vs {
		_, err := v.Decode()
		errs = append(errs, err)
		for _, a := range accessors {
			errs = append(errs, a.call(vs, name))
		}
		// JSON into destinations the data does not fit.
		var n int
		var s struct {
			PW  int    `json:"pw"`
			PIN string `json:"pin"`
		}
		var list []bool
		errs = append(errs, vs.JSON(name, &n), vs.JSON(name, &s), vs.JSON(name, &list))
	}

	// Marshalling invalid values, parsing and unmarshalling structure.
	_, err := json.Marshal(Variables{"x": {Type: TypeString, Value: json.RawMessage(`s3cr3t`)}})
	errs = append(errs, err)
	_, err = json.Marshal(Variables{"x": {Type: TypeString, Value: json.RawMessage(`"s3cr3t`)}})
	errs = append(errs, err)
	_, err = JSONVar(unencodable{secret})
	errs = append(errs, err)
	_, err = JSONRawVar([]byte(`{"pw":"s3cr3t"`))
	errs = append(errs, err)
	_, err = ParseDate(secret)
	errs = append(errs, err)
	var tm Time
	errs = append(errs, tm.UnmarshalJSON([]byte(`"s3cr3t"`)), tm.UnmarshalJSON([]byte(secretNum)))
	for _, raw := range []string{
		`{"x":{"type":"String","value":"s3cr3t","valueInfo":{"filename":987654321}}}`,
		`{"x":{"type":"String","value":"s3cr3t","valueInfo":["s3cr3t"]}}`,
		`{"x":{"type":987654321,"value":"s3cr3t"}}`,
		`{"x":["s3cr3t"]}`,
		`{"x":987654321}`,
		`["s3cr3t"]`,
	} {
		var got Variables
		errs = append(errs, json.Unmarshal([]byte(raw), &got))
	}

	count := 0
	for _, err := range errs {
		if err == nil {
			continue
		}
		count++
		msg := err.Error()
		assert.NotContains(t, msg, secret)
		assert.NotContains(t, msg, secretNum)
		assert.NotContains(t, msg, "98765432")
	}
	assert.Greater(t, count, 150, "the test must actually produce errors")
}

func TestUnmarshalVariable(t *testing.T) {
	t.Run("structure errors", func(t *testing.T) {
		tests := []struct {
			raw      string
			sentinel error
		}{
			{`{"x":{"type":5,"value":1}}`, ErrVariableType},
			{`{"x":{"type":"Long","value":1,"valueInfo":[]}}`, ErrVariableValue},
			{`{"x":{"type":"Long","value":1,"valueInfo":"x"}}`, ErrVariableValue},
			{`{"x":{"type":"File","value":null,"valueInfo":{"filename":1}}}`, ErrVariableValue},
			{`{"x":{"type":"String","value":"a","valueInfo":{"transient":"yes"}}}`, ErrVariableValue},
			{`{"x":[1]}`, ErrVariableValue},
			{`{"x":"String"}`, ErrVariableValue},
		}
		for _, tt := range tests {
			var vs Variables
			err := json.Unmarshal([]byte(tt.raw), &vs)
			require.Error(t, err, tt.raw)
			assert.ErrorIs(t, err, tt.sentinel, tt.raw)
			var ve *VariableError
			require.ErrorAs(t, err, &ve, tt.raw)
			assert.Equal(t, "x", ve.Name, tt.raw)
		}
		var vs Variables
		err := json.Unmarshal([]byte(`[1]`), &vs)
		assert.ErrorIs(t, err, ErrVariableValue)
	})
	t.Run("null", func(t *testing.T) {
		vs := Variables{"keep": StringVar("x")}
		require.NoError(t, json.Unmarshal([]byte(`null`), &vs))
		assert.Nil(t, vs)

		require.NoError(t, json.Unmarshal([]byte(`{"a":null}`), &vs))
		assert.True(t, vs.Has("a"))
		_, err := vs.Value("a")
		assert.ErrorIs(t, err, ErrVariableType, "a null entry has no type")
	})
	t.Run("adds to existing map", func(t *testing.T) {
		vs := Variables{"keep": StringVar("x")}
		require.NoError(t, json.Unmarshal([]byte(`{"new":{"type":"Boolean","value":false}}`), &vs))
		assert.True(t, vs.Has("keep"))
		b, err := vs.Bool("new")
		require.NoError(t, err)
		assert.False(t, b)
	})
	t.Run("inside a struct", func(t *testing.T) {
		var task struct {
			ID        string    `json:"id"`
			Variables Variables `json:"variables"`
		}
		require.NoError(t, json.Unmarshal([]byte(`{"id":"t1","variables":{"n":{"type":"Long","value":9223372036854775807,"valueInfo":{}}}}`), &task))
		n, err := task.Variables.Long("n")
		require.NoError(t, err)
		assert.Equal(t, int64(math.MaxInt64), n)
	})
	t.Run("re-marshal keeps the exact text", func(t *testing.T) {
		in := `{"big":{"type":"Long","value":9007199254740993,"valueInfo":{}},"f":{"type":"File","value":null,"valueInfo":{"filename":"a","mimeType":"b","encoding":"c"}},"u":{"type":"Foo","value":{"x":[1,2]},"valueInfo":{}}}`
		var vs Variables
		require.NoError(t, json.Unmarshal([]byte(in), &vs))
		out, err := json.Marshal(vs)
		require.NoError(t, err)
		assert.Equal(t, in, string(out))
	})
}

func TestParseDate(t *testing.T) {
	tests := []struct {
		in     string
		want   time.Time // in UTC
		offset int       // seconds east of UTC
	}{
		{"2024-03-01T12:30:45.123+0000", time.Date(2024, 3, 1, 12, 30, 45, 123e6, time.UTC), 0},
		{"2024-03-01T12:30:45.123+0530", time.Date(2024, 3, 1, 7, 0, 45, 123e6, time.UTC), 5*3600 + 30*60},
		{"2024-03-01T12:30:45.123-0800", time.Date(2024, 3, 1, 20, 30, 45, 123e6, time.UTC), -8 * 3600},
		{"2024-03-01T00:00:00.000+1400", time.Date(2024, 2, 29, 10, 0, 0, 0, time.UTC), 14 * 3600},
		{"2024-03-01T23:59:59.999-1200", time.Date(2024, 3, 2, 11, 59, 59, 999e6, time.UTC), -12 * 3600},
		{"1970-01-01T00:00:00.000+0100", time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC), 3600},
		{"0001-01-01T00:00:00.000+0000", time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), 0},
		{"9999-12-31T23:59:59.999+0000", time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC), 0},
		// Tolerated on input: RFC 3339 and variants.
		{"2024-03-01T12:30:45Z", time.Date(2024, 3, 1, 12, 30, 45, 0, time.UTC), 0},
		{"2024-03-01T12:30:45.123Z", time.Date(2024, 3, 1, 12, 30, 45, 123e6, time.UTC), 0},
		{"2024-03-01T12:30:45.123+02:00", time.Date(2024, 3, 1, 10, 30, 45, 123e6, time.UTC), 2 * 3600},
		{"2024-03-01T12:30:45.1234567+02:00", time.Date(2024, 3, 1, 10, 30, 45, 123456700, time.UTC), 2 * 3600},
		{"2024-03-01T12:30:45-0300", time.Date(2024, 3, 1, 15, 30, 45, 0, time.UTC), -3 * 3600},
		{"2024-03-01T12:30:45.5+0100", time.Date(2024, 3, 1, 11, 30, 45, 5e8, time.UTC), 3600},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseDate(tt.in)
			require.NoError(t, err)
			assert.True(t, tt.want.Equal(got), "got %v, want %v", got, tt.want)
			_, off := got.Zone()
			assert.Equal(t, tt.offset, off)
		})
	}

	for _, bad := range []string{
		"", "garbage", "2024-03-01", "2024-03-01 12:30:45.123+0000", "2024-03-01T12:30:45.123",
		"2024-13-01T12:30:45.123+0000", "2024-02-30T12:30:45.123+0000", "2024-03-01T25:00:00.000+0000",
		"2024-03-01T12:30:45.123+05", "24-03-01T12:30:45.123+0000", "2024-03-01T12:30:45.123+0000 ",
		"1709296245123",
	} {
		t.Run("bad "+bad, func(t *testing.T) {
			_, err := ParseDate(bad)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "yyyy-MM-dd'T'HH:mm:ss.SSSZ")
			assert.Contains(t, err.Error(), DateLayout)
			if bad != "" {
				assert.NotContains(t, err.Error(), bad)
			}
		})
	}
}

func TestFormatDate(t *testing.T) {
	tests := []struct {
		in   time.Time
		want string
	}{
		{time.Date(2024, 3, 1, 12, 30, 45, 123999999, time.FixedZone("", 5*3600+30*60)), "2024-03-01T12:30:45.123+0530"},
		{time.Date(2024, 3, 1, 12, 30, 45, 0, time.UTC), "2024-03-01T12:30:45.000+0000"},
		{time.Date(2024, 3, 1, 12, 30, 45, 1e6, time.FixedZone("", -(3*3600+30*60))), "2024-03-01T12:30:45.001-0330"},
		{time.Date(1900, 1, 1, 0, 0, 0, 0, time.FixedZone("LMT", 19*60+32)), "1899-12-31T23:40:28.000+0000"},
	}
	for _, tt := range tests {
		got := FormatDate(tt.in)
		assert.Equal(t, tt.want, got)
		back, err := ParseDate(got)
		require.NoError(t, err)
		assert.True(t, tt.in.Truncate(time.Millisecond).Equal(back), "round trip of %s", got)
	}
}

func TestTime(t *testing.T) {
	type dto struct {
		When Time `json:"when"`
		Opt  Time `json:"opt,omitzero"`
	}

	t.Run("null to zero", func(t *testing.T) {
		d := dto{When: Time{time.Now()}}
		require.NoError(t, json.Unmarshal([]byte(`{"when":null}`), &d))
		assert.True(t, d.When.IsZero())
	})
	t.Run("zero to null", func(t *testing.T) {
		b, err := json.Marshal(dto{})
		require.NoError(t, err)
		assert.Equal(t, `{"when":null}`, string(b))
	})
	t.Run("round trip", func(t *testing.T) {
		in := dto{
			When: Time{time.Date(2024, 3, 1, 12, 30, 45, 123e6, time.FixedZone("", 2*3600))},
			Opt:  Time{time.Date(1999, 12, 31, 23, 59, 59, 999e6, time.UTC)},
		}
		b, err := json.Marshal(in)
		require.NoError(t, err)
		assert.Equal(t, `{"when":"2024-03-01T12:30:45.123+0200","opt":"1999-12-31T23:59:59.999+0000"}`, string(b))
		var out dto
		require.NoError(t, json.Unmarshal(b, &out))
		assert.True(t, in.When.Equal(out.When.Time))
		assert.True(t, in.Opt.Equal(out.Opt.Time))
	})
	t.Run("engine response", func(t *testing.T) {
		var d dto
		require.NoError(t, json.Unmarshal([]byte(`{"when":"2024-03-01T08:00:00.000+0100"}`), &d))
		assert.True(t, d.When.Equal(time.Date(2024, 3, 1, 7, 0, 0, 0, time.UTC)))
	})
	t.Run("errors", func(t *testing.T) {
		for _, raw := range []string{`"2024-03-01"`, `1709280000000`, `true`, `{}`, `"`} {
			var tm Time
			assert.Error(t, tm.UnmarshalJSON([]byte(raw)), raw)
		}
		_, err := json.Marshal(Time{time.Date(12345, 1, 1, 0, 0, 0, 0, time.UTC)})
		assert.Error(t, err)
	})
}

func TestValueErrorUnwrap(t *testing.T) {
	// The multi-unwrap keeps both the sentinel and the cause reachable,
	// while the message only shows the generic reason.
	cause := errors.New("cause with s3cr3t")
	err := &VariableError{Name: "x", Err: &valueError{sentinel: ErrVariableValue, reason: "r", cause: cause}}
	assert.ErrorIs(t, err, ErrVariableValue)
	assert.ErrorIs(t, err, cause)
	assert.False(t, strings.Contains(err.Error(), "s3cr3t"))
}
