package camunda7

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Type names of the engine's typed variables, exactly as the REST API
// spells them in VariableValueDto.type. Requests always carry an explicit
// type so the engine never has to guess one from the JSON value (it would
// turn every number into Integer or Double and lose Long precision).
const (
	TypeString  = "String"  // TypeString is a text value: Go string.
	TypeBoolean = "Boolean" // TypeBoolean is a boolean value: Go bool.
	TypeShort   = "Short"   // TypeShort is a 16-bit integer: Go int16.
	TypeInteger = "Integer" // TypeInteger is a 32-bit integer: Go int32.
	TypeLong    = "Long"    // TypeLong is a 64-bit integer: Go int64.
	TypeDouble  = "Double"  // TypeDouble is a 64-bit float: Go float64.
	TypeDate    = "Date"    // TypeDate is a date in DateLayout: Go time.Time.
	TypeNull    = "Null"    // TypeNull is an explicit null value.
	TypeBytes   = "Bytes"   // TypeBytes is binary data sent as standard base64.
	TypeFile    = "File"    // TypeFile is a file: base64 content plus filename, mimeType and encoding.
	TypeObject  = "Object"  // TypeObject is a serialized Java object; the value is the serialized text.
	TypeJSON    = "Json"    // TypeJSON is a Spin JSON value; the value is the JSON text as a string.
	TypeXML     = "Xml"     // TypeXML is a Spin XML value; the value is the XML text as a string.
)

// jsonDataFormat is the serializationDataFormat of Object variables whose
// serialized form is JSON, the only Object format this package reads.
const jsonDataFormat = "application/json"

// Errors reported by the variable accessors, wrapped in a *VariableError.
// Test for them with errors.Is. Their messages (and every error of this
// package about a variable) never contain the variable's value, which may
// be a secret or personal data.
var (
	// ErrVariableMissing means the variable is not in the set at all.
	ErrVariableMissing = errors.New("camunda7: variable missing")
	// ErrVariableType means the variable's type is not the one asked for,
	// or is one this package cannot decode.
	ErrVariableType = errors.New("camunda7: variable has the wrong or an unsupported type")
	// ErrVariableNull means the variable exists but its value is null.
	ErrVariableNull = errors.New("camunda7: variable is null")
	// ErrVariableValue means the value does not fit the variable's type
	// (for example a Long holding 1.5, or Bytes that are not base64).
	ErrVariableValue = errors.New("camunda7: variable value malformed")
	// ErrNoContent means a File variable about to be sent has no content (a
	// null value): the engine answers such a request with a 500, so Complete,
	// Failure and BPMNError refuse it before sending. A File as fetchAndLock
	// returns it carries only its metadata; download the content with
	// Client.VariableData (or LocalVariableData), or build the variable with
	// FileVar.
	ErrNoContent = errors.New("camunda7: File variable has no content (fetched Files carry only their metadata: " +
		"download the content with Client.VariableData, or build the variable with FileVar)")
)

// VariableError describes why a variable could not be built, sent or read.
// It carries the variable's name and types but never its value, so it is
// safe to log. Unwrap gives Err, which wraps one of the ErrVariable
// sentinels.
type VariableError struct {
	Name string // Name is the variable's name; empty when not known (Variable.Decode).
	Type string // Type is the variable's type as sent or received.
	Want string // Want is the type the caller asked for; empty when no particular type was asked for.
	Err  error  // Err is the reason; it wraps ErrVariableMissing, ErrVariableType, ErrVariableNull, ErrVariableValue or ErrNoContent.
}

// Error formats the error, e.g.
// `camunda7: variable "amount": has type String, want Long`.
func (e *VariableError) Error() string {
	var b strings.Builder
	b.WriteString("camunda7: variable")
	sep := " " // "variable has type X" without a name, "variable "n": has type X" with one
	if e.Name != "" {
		b.WriteString(" " + strconv.Quote(e.Name))
		sep = ": "
	}
	switch {
	case errors.Is(e.Err, ErrVariableMissing):
		b.WriteString(sep + "missing")
		return b.String()
	case errors.Is(e.Err, ErrVariableType):
		b.WriteString(sep + "has type " + quoteType(e.Type))
		if e.Want != "" {
			b.WriteString(", want " + e.Want)
		}
		if e.Err == ErrVariableType {
			return b.String()
		}
		// Print only the detail after the sentinel's own text.
		b.WriteString(": " + strings.TrimPrefix(e.Err.Error(), ErrVariableType.Error()+": "))
		return b.String()
	default:
		if e.Type != "" {
			b.WriteString(" (type " + quoteType(e.Type) + ")")
		}
	}
	if e.Err != nil {
		b.WriteString(": " + strings.TrimPrefix(e.Err.Error(), "camunda7: "))
	}
	return b.String()
}

// Unwrap returns Err so errors.Is and errors.As see the reason.
func (e *VariableError) Unwrap() error { return e.Err }

// quoteType prints a type name as is when it looks like one and quoted
// otherwise, so odd input cannot garble log lines.
func quoteType(t string) string {
	if t == "" {
		return `""`
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return strconv.Quote(t)
		}
	}
	return t
}

// valueError is a value-related failure whose message is a fixed, generic
// reason. It may keep an underlying cause for errors.As, but never prints
// it: causes such as strconv or encoding/json errors quote the input.
type valueError struct {
	sentinel error
	reason   string
	cause    error
}

func (e *valueError) Error() string { return e.sentinel.Error() + ": " + e.reason }

func (e *valueError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.cause}
}

// malformed returns an ErrVariableValue error with a generic reason.
func malformed(reason string) error {
	return &valueError{sentinel: ErrVariableValue, reason: reason}
}

// ValueInfo is the valueInfo object of a typed variable: type-specific
// metadata the engine needs to interpret the value. Empty fields are left
// out, and an empty ValueInfo marshals as {} as the engine itself does.
type ValueInfo struct {
	// ObjectTypeName is the Java class of an Object value, e.g. "java.util.LinkedHashMap".
	ObjectTypeName string `json:"objectTypeName,omitempty"`
	// SerializationDataFormat is how an Object value is serialized, e.g. "application/json".
	SerializationDataFormat string `json:"serializationDataFormat,omitempty"`
	// Filename is a File value's file name; the engine requires it.
	Filename string `json:"filename,omitempty"`
	// MimeType is a File value's media type (the engine's key is "mimeType").
	MimeType string `json:"mimeType,omitempty"`
	// Encoding is a File value's character encoding, e.g. "UTF-8".
	Encoding string `json:"encoding,omitempty"`
	// Transient asks the engine not to persist the variable.
	Transient bool `json:"transient,omitempty"`
}

// Variable is one typed variable in the engine's wire form
// (VariableValueDto). Value holds the exact JSON text of the value so that
// nothing is lost in transit, notably Long values beyond 2^53 that a
// float64 would round. Build variables with the constructors (StringVar,
// LongVar, ...) and read them with Decode or the Variables accessors.
type Variable struct {
	// Type is the engine type name, e.g. TypeLong. It is always sent.
	Type string `json:"type"`
	// Value is the exact JSON text of the value; nil or empty marshals as null.
	Value json.RawMessage `json:"value"`
	// ValueInfo is the type-specific metadata.
	ValueInfo ValueInfo `json:"valueInfo"`

	// err is a construction error (e.g. a NaN Double) that MarshalJSON
	// reports, so a bad variable fails before any request is sent.
	err error
}

// wireVariable is Variable without methods, for encoding/json.
type wireVariable struct {
	Type      string          `json:"type"`
	Value     json.RawMessage `json:"value"`
	ValueInfo ValueInfo       `json:"valueInfo"`
}

// check reports why v cannot be sent, as a *VariableError without a name.
func (v Variable) check() *VariableError {
	switch {
	case v.err != nil:
		return &VariableError{Type: v.Type, Err: v.err}
	case v.Type == "":
		return &VariableError{Err: fmt.Errorf("%w: no type set; the engine needs an explicit type", ErrVariableType)}
	case len(bytes.TrimSpace(v.Value)) > 0 && !json.Valid(v.Value):
		return &VariableError{Type: v.Type, Err: malformed("value is not valid JSON")}
	}
	return nil
}

// MarshalJSON writes the engine's {"type","value","valueInfo"} form. It
// fails, with a *VariableError that does not contain the value, if the
// variable was built from an unrepresentable value (e.g. DoubleVar(NaN)),
// has no type, or holds a Value that is not valid JSON, so that a bad
// variable stops the request before it is sent.
func (v Variable) MarshalJSON() ([]byte, error) {
	if err := v.check(); err != nil {
		return nil, err
	}
	value := v.Value
	if len(bytes.TrimSpace(value)) == 0 {
		value = json.RawMessage("null")
	}
	return json.Marshal(wireVariable{Type: v.Type, Value: value, ValueInfo: v.ValueInfo})
}

// UnmarshalJSON reads the engine's {"type","value","valueInfo"} form. A
// missing or null valueInfo reads as empty, and unknown types are kept
// with their raw value so that one unexpected variable does not make a
// whole response unreadable; Decode and the accessors report them. JSON
// null leaves v unchanged, following the encoding/json convention.
func (v *Variable) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if string(b) == "null" {
		return nil
	}
	var w struct {
		Type      json.RawMessage `json:"type"`
		Value     json.RawMessage `json:"value"`
		ValueInfo json.RawMessage `json:"valueInfo"`
	}
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &w) != nil {
		return &VariableError{Err: malformed("variable is not a JSON object")}
	}
	var out Variable
	if t := w.Type; len(t) > 0 && string(t) != "null" {
		if t[0] != '"' || json.Unmarshal(t, &out.Type) != nil {
			return &VariableError{Err: fmt.Errorf("%w: type is not a JSON string", ErrVariableType)}
		}
	}
	if vi := w.ValueInfo; len(vi) > 0 && string(vi) != "null" {
		// Decoding errors are not passed on: they can quote the input.
		if vi[0] != '{' || json.Unmarshal(vi, &out.ValueInfo) != nil {
			return &VariableError{Type: out.Type, Err: malformed("valueInfo is not an object of the expected fields")}
		}
	}
	out.Value = w.Value
	*v = out
	return nil
}

// Variables is a set of typed variables by name, as the engine sends and
// receives them (fetchAndLock results, complete and BPMN error requests,
// ...). The accessors read one variable as a Go type and report problems
// as a *VariableError naming the variable.
type Variables map[string]Variable

// MarshalJSON writes the variables as a JSON object. It checks every
// variable first, so a bad one fails with a *VariableError that names it
// (in sorted name order, for stable errors) before anything is sent. A nil
// Variables marshals as null, like any nil map.
func (vs Variables) MarshalJSON() ([]byte, error) {
	if vs == nil {
		return []byte("null"), nil
	}
	for _, name := range slices.Sorted(maps.Keys(vs)) {
		if err := vs[name].check(); err != nil {
			err.Name = name
			return nil, err
		}
	}
	return json.Marshal(map[string]Variable(vs))
}

// UnmarshalJSON reads a JSON object of variables, naming the variable in
// any error. Like encoding/json for maps, it adds to an existing map and
// reads null as a nil map.
func (vs *Variables) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if string(b) == "null" {
		*vs = nil
		return nil
	}
	var raw map[string]json.RawMessage
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &raw) != nil {
		return fmt.Errorf("%w: variables are not a JSON object", ErrVariableValue)
	}
	out := *vs
	if out == nil {
		out = make(Variables, len(raw))
	}
	for _, name := range slices.Sorted(maps.Keys(raw)) {
		var v Variable
		if err := v.UnmarshalJSON(raw[name]); err != nil {
			var ve *VariableError
			if errors.As(err, &ve) {
				ve.Name = name
			}
			return err
		}
		out[name] = v
	}
	*vs = out
	return nil
}

// mustJSON marshals values that cannot fail to marshal (strings, bools).
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		// Unreachable for the types passed in; never panic on behalf of callers.
		return json.RawMessage("null")
	}
	return b
}

// StringVar builds a String variable. Invalid UTF-8 is replaced by U+FFFD
// when encoded as JSON; send binary data with BytesVar.
func StringVar(s string) Variable {
	return Variable{Type: TypeString, Value: mustJSON(s)}
}

// BoolVar builds a Boolean variable.
func BoolVar(b bool) Variable {
	return Variable{Type: TypeBoolean, Value: mustJSON(b)}
}

// ShortVar builds a Short (16-bit) variable.
func ShortVar(n int16) Variable {
	return Variable{Type: TypeShort, Value: json.RawMessage(strconv.FormatInt(int64(n), 10))}
}

// IntegerVar builds an Integer (32-bit) variable.
func IntegerVar(n int32) Variable {
	return Variable{Type: TypeInteger, Value: json.RawMessage(strconv.FormatInt(int64(n), 10))}
}

// LongVar builds a Long (64-bit) variable. The number is written as exact
// decimal text, so values beyond 2^53 keep every digit.
func LongVar(n int64) Variable {
	return Variable{Type: TypeLong, Value: json.RawMessage(strconv.FormatInt(n, 10))}
}

// DoubleVar builds a Double variable. JSON cannot carry NaN or an
// infinity, so for those it returns a Variable whose MarshalJSON fails
// with an ErrVariableValue error, stopping the request before it is sent.
func DoubleVar(f float64) Variable {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return Variable{Type: TypeDouble, err: malformed("Double is NaN or infinite, which JSON cannot carry")}
	}
	return Variable{Type: TypeDouble, Value: mustJSON(f)}
}

// DateVar builds a Date variable formatted with FormatDate, the only
// format the engine accepts. A year that does not fit the format's four
// digits makes MarshalJSON fail instead of being rejected by the engine.
// Note that the engine reads dates before 1582-10-15 in the Julian calendar.
func DateVar(t time.Time) Variable {
	if !dateYearOK(t) {
		return Variable{Type: TypeDate, err: malformed("Date year outside 0000-9999 cannot be written in the engine format")}
	}
	return Variable{Type: TypeDate, Value: mustJSON(FormatDate(t))}
}

// NullVar builds a variable with an explicit null value, for example to
// clear a variable while keeping it defined.
func NullVar() Variable {
	return Variable{Type: TypeNull, Value: json.RawMessage("null")}
}

// BytesVar builds a Bytes variable; the data travels as standard base64.
func BytesVar(b []byte) Variable {
	return Variable{Type: TypeBytes, Value: mustJSON(base64.StdEncoding.EncodeToString(b))}
}

// encodeJSON marshals v for JSONVar and ObjectVar. The error keeps the
// encoding/json cause for errors.As but does not print it, because
// marshaler errors can quote the value.
func encodeJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, &valueError{sentinel: ErrVariableValue, reason: fmt.Sprintf("cannot encode a %T as JSON", v), cause: err}
	}
	return b, nil
}

// JSONVar builds a Json (Spin) variable from the JSON encoding of v. The
// engine expects the JSON text as a JSON string, which this takes care of.
// The error, if v cannot be encoded, wraps ErrVariableValue.
func JSONVar(v any) (Variable, error) {
	b, err := encodeJSON(v)
	if err != nil {
		return Variable{}, &VariableError{Type: TypeJSON, Err: err}
	}
	return Variable{Type: TypeJSON, Value: mustJSON(string(b))}, nil
}

// JSONRawVar builds a Json (Spin) variable from JSON text, kept as given.
// It checks that raw is valid JSON, as the engine would otherwise store
// text it cannot parse later.
func JSONRawVar(raw []byte) (Variable, error) {
	if !json.Valid(raw) {
		return Variable{}, &VariableError{Type: TypeJSON, Err: malformed("Json text is not valid JSON")}
	}
	return Variable{Type: TypeJSON, Value: mustJSON(string(raw))}, nil
}

// XMLVar builds an Xml (Spin) variable from XML text. The text is not
// checked; the engine parses it when a script or mapping reads it.
func XMLVar(s string) Variable {
	return Variable{Type: TypeXML, Value: mustJSON(s)}
}

// ObjectVar builds an Object variable serialized as JSON, which the engine
// deserializes into the Java class javaTypeName (for example
// "java.util.LinkedHashMap" or "java.util.ArrayList") when Java code reads
// it. The serialized form travels as a JSON string, as the engine
// requires. javaTypeName must not be empty.
func ObjectVar(javaTypeName string, v any) (Variable, error) {
	if javaTypeName == "" {
		return Variable{}, &VariableError{Type: TypeObject, Err: fmt.Errorf("%w: Object needs a Java type name", ErrVariableValue)}
	}
	b, err := encodeJSON(v)
	if err != nil {
		return Variable{}, &VariableError{Type: TypeObject, Err: err}
	}
	return Variable{
		Type:  TypeObject,
		Value: mustJSON(string(b)),
		ValueInfo: ValueInfo{
			ObjectTypeName:          javaTypeName,
			SerializationDataFormat: jsonDataFormat,
		},
	}, nil
}

// FileVar builds a File variable: the content as base64 plus the metadata
// the engine keeps with it. The engine requires a filename, so an empty
// one makes MarshalJSON fail before the request is sent.
func FileVar(filename, mimeType, encoding string, data []byte) Variable {
	v := Variable{
		Type:  TypeFile,
		Value: mustJSON(base64.StdEncoding.EncodeToString(data)),
		ValueInfo: ValueInfo{
			Filename: filename,
			MimeType: mimeType,
			Encoding: encoding,
		},
	}
	if filename == "" {
		v.err = malformed("File needs a filename")
	}
	return v
}

// WithTransient returns a copy of v marked transient, so the engine uses
// the value during the current transaction but does not persist it.
func (v Variable) WithTransient() Variable {
	v.ValueInfo.Transient = true
	return v
}

// FileValue is a File variable's metadata (the engine omits the content in
// responses and serves it from a separate endpoint).
type FileValue struct {
	Filename string // Filename is the file's name.
	MimeType string // MimeType is the file's media type, if known.
	Encoding string // Encoding is the file's character encoding, if known.
	Content  []byte // Content is the data, only when the response carried a value.
}

// canonicalTypes maps lower-cased type names to the engine's spelling. The
// engine itself reads type names with a case-insensitive first letter, and
// forks or proxies may not capitalise them.
var canonicalTypes = func() map[string]string {
	m := make(map[string]string)
	for _, t := range []string{TypeString, TypeBoolean, TypeShort, TypeInteger, TypeLong, TypeDouble,
		TypeDate, TypeNull, TypeBytes, TypeFile, TypeObject, TypeJSON, TypeXML} {
		m[strings.ToLower(t)] = t
	}
	return m
}()

// canonicalType returns the engine spelling of t, or "" for unknown types.
func canonicalType(t string) string { return canonicalTypes[strings.ToLower(t)] }

// rawValue returns the value's JSON text without surrounding whitespace.
func (v Variable) rawValue() []byte { return bytes.TrimSpace(v.Value) }

// isNull reports whether the value is absent or JSON null.
// IsNull reports whether v's value is null (of any type).
func (v Variable) IsNull() bool { return v.isNull() }

func (v Variable) isNull() bool {
	raw := v.rawValue()
	return len(raw) == 0 || string(raw) == "null"
}

// bitsOf is the integer width of an integer type name, or 0.
func bitsOf(canonical string) int {
	switch canonical {
	case TypeShort:
		return 16
	case TypeInteger:
		return 32
	case TypeLong:
		return 64
	}
	return 0
}

// parseString reads a JSON string value.
func parseString(raw []byte) (string, error) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", malformed("value is not a JSON string")
	}
	return s, nil
}

// isJSONInteger reports whether raw is a JSON number without fraction or
// exponent.
func isJSONInteger(raw []byte) bool {
	if len(raw) > 0 && raw[0] == '-' {
		raw = raw[1:]
	}
	if len(raw) > 1 && raw[0] == '0' {
		return false
	}
	return allDigits(string(raw))
}

// parseInt reads an integer value that must fit in bits, from its exact
// JSON text (never through float64, which would round beyond 2^53) or
// from a JSON string holding a decimal integer, which Jackson on the
// engine side coerces likewise. typeName names the range in errors.
func parseInt(raw []byte, bits int, typeName string) (int64, error) {
	text := string(raw)
	if len(raw) > 0 && raw[0] == '"' {
		s, err := parseString(raw)
		if err != nil {
			return 0, err
		}
		// Like Java's Long.parseLong: optional sign, decimal digits.
		digits := s
		if digits != "" && (digits[0] == '+' || digits[0] == '-') {
			digits = digits[1:]
		}
		if !allDigits(digits) {
			return 0, malformed("value is not an integer")
		}
		text = s
	} else if !isJSONInteger(raw) {
		return 0, malformed("value is not an integer")
	}
	n, err := strconv.ParseInt(text, 10, bits)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, malformed("value is out of range for " + typeName)
		}
		return 0, malformed("value is not an integer")
	}
	return n, nil
}

// allDigits reports whether s is a non-empty run of ASCII digits.
func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// parseDouble reads a Double value: a JSON number, or a JSON string holding
// a number or NaN/Infinity/-Infinity, which is how Jackson writes
// non-finite doubles.
func parseDouble(raw []byte) (float64, error) {
	text := raw
	if len(raw) > 0 && raw[0] == '"' {
		s, err := parseString(raw)
		if err != nil {
			return 0, err
		}
		switch s {
		case "NaN":
			return math.NaN(), nil
		case "Infinity", "+Infinity":
			return math.Inf(1), nil
		case "-Infinity":
			return math.Inf(-1), nil
		}
		text = []byte(s)
	}
	var num json.Number
	if len(text) == 0 || !(text[0] == '-' || text[0] >= '0' && text[0] <= '9') || json.Unmarshal(text, &num) != nil {
		return 0, malformed("value is not a number")
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil {
		return 0, malformed("value is out of range for Double")
	}
	return f, nil
}

// parseBytes reads base64 data. The engine writes standard padded base64;
// unpadded input is accepted too.
func parseBytes(raw []byte) ([]byte, error) {
	s, err := parseString(raw)
	if err != nil {
		return nil, err
	}
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	if b, err := base64.RawStdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return nil, malformed("value is not base64")
}

// parseDate reads a Date value with ParseDate.
func parseDate(raw []byte) (time.Time, error) {
	s, err := parseString(raw)
	if err != nil {
		return time.Time{}, err
	}
	t, err := ParseDate(s)
	if err != nil {
		return time.Time{}, malformed("value is not a date in the engine format " + DateLayout)
	}
	return t, nil
}

// isJSONFormat reports whether an Object's serializationDataFormat is JSON,
// ignoring case and media type parameters.
func isJSONFormat(format string) bool {
	mt, _, err := mime.ParseMediaType(format)
	return err == nil && mt == jsonDataFormat
}

// checkObjectFormat reports an Object variable whose serialization format is
// not JSON, the only one this package reads; other types pass.
func checkObjectFormat(v Variable, canonical string) error {
	if canonical == TypeObject && !isJSONFormat(v.ValueInfo.SerializationDataFormat) {
		return fmt.Errorf("%w: Object serialization format %q is not %s", ErrVariableType, v.ValueInfo.SerializationDataFormat, jsonDataFormat)
	}
	return nil
}

// jsonText returns the JSON text of a Json variable or of an Object
// variable serialized as JSON. Serialized values arrive as a JSON string
// holding the text; deserialized ones (deserializeValues=true) arrive as
// the JSON itself, which is returned as is.
func jsonText(v Variable, canonical string) (json.RawMessage, error) {
	if err := checkObjectFormat(v, canonical); err != nil {
		return nil, err
	}
	raw := v.rawValue()
	if raw[0] != '"' {
		if !json.Valid(raw) {
			return nil, malformed("value is not valid JSON")
		}
		return bytes.Clone(raw), nil
	}
	s, err := parseString(raw)
	if err != nil {
		return nil, err
	}
	if !json.Valid([]byte(s)) {
		return nil, malformed("serialized text is not valid JSON")
	}
	return json.RawMessage(s), nil
}

// parseFile reads a File variable's metadata and, if present, its content.
func parseFile(v Variable) (FileValue, error) {
	fv := FileValue{Filename: v.ValueInfo.Filename, MimeType: v.ValueInfo.MimeType, Encoding: v.ValueInfo.Encoding}
	if v.isNull() {
		return fv, nil
	}
	b, err := parseBytes(v.rawValue())
	if err != nil {
		return FileValue{}, err
	}
	fv.Content = b
	return fv, nil
}

// Decode returns the value as the Go type matching the variable's type:
// string (String, Xml), bool (Boolean), int16 (Short), int32 (Integer),
// int64 (Long), float64 (Double), time.Time (Date), []byte (Bytes),
// FileValue (File), json.RawMessage (Json, and Object serialized as
// application/json: the serialized JSON text), and nil for Null or a null
// value. An unknown type, or an Object in another serialization format,
// gives an error wrapping ErrVariableType; a value that does not fit its
// type gives one wrapping ErrVariableValue. Errors are *VariableError
// without a Name and never contain the value.
func (v Variable) Decode() (any, error) {
	val, err := v.decode()
	if err != nil {
		return nil, &VariableError{Type: v.Type, Err: err}
	}
	return val, nil
}

// decode implements Decode, returning the bare reason on failure.
func (v Variable) decode() (any, error) {
	canonical := canonicalType(v.Type)
	switch canonical {
	case "":
		return nil, fmt.Errorf("%w: unknown type", ErrVariableType)
	case TypeFile:
		return parseFile(v)
	case TypeNull:
		return nil, nil
	}
	if v.isNull() {
		return nil, checkObjectFormat(v, canonical)
	}
	raw := v.rawValue()
	switch canonical {
	case TypeString, TypeXML:
		return parseString(raw)
	case TypeBoolean:
		return parseBool(raw)
	case TypeShort:
		n, err := parseInt(raw, 16, canonical)
		return int16(n), err
	case TypeInteger:
		n, err := parseInt(raw, 32, canonical)
		return int32(n), err
	case TypeLong:
		return parseInt(raw, 64, canonical)
	case TypeDouble:
		return parseDouble(raw)
	case TypeDate:
		return parseDate(raw)
	case TypeBytes:
		return parseBytes(raw)
	case TypeJSON, TypeObject:
		return jsonText(v, canonical)
	}
	return nil, fmt.Errorf("%w: unknown type", ErrVariableType)
}

// parseBool reads a JSON boolean.
func parseBool(raw []byte) (bool, error) {
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, malformed("value is not a JSON boolean")
}

// lookup returns the named variable and its canonical type if that type is
// one of accept; otherwise a *VariableError for the missing variable, a
// wrong type, or a null value (a null value of an accepted type, or a
// variable of type Null, which is how a cleared variable looks).
func (vs Variables) lookup(name, want string, accept ...string) (Variable, string, *VariableError) {
	v, ok := vs[name]
	if !ok {
		return Variable{}, "", &VariableError{Name: name, Want: want, Err: ErrVariableMissing}
	}
	canonical := canonicalType(v.Type)
	if canonical != TypeNull && !slices.Contains(accept, canonical) {
		return Variable{}, "", &VariableError{Name: name, Type: v.Type, Want: want, Err: ErrVariableType}
	}
	if canonical == TypeNull || v.isNull() {
		return Variable{}, "", &VariableError{Name: name, Type: v.Type, Want: want, Err: ErrVariableNull}
	}
	return v, canonical, nil
}

// fail wraps a reason into a *VariableError for the named variable.
func fail(name string, v Variable, want string, err error) *VariableError {
	return &VariableError{Name: name, Type: v.Type, Want: want, Err: err}
}

// read looks up a variable of one of the accepted types and parses its value,
// reporting every failure as a *VariableError naming the variable.
func read[T any](vs Variables, name, want string, parse func([]byte) (T, error), accept ...string) (T, error) {
	var zero T
	v, _, verr := vs.lookup(name, want, accept...)
	if verr != nil {
		return zero, verr
	}
	x, err := parse(v.rawValue())
	if err != nil {
		return zero, fail(name, v, want, err)
	}
	return x, nil
}

// Has reports whether a variable of that name is present, whatever its
// type or value.
func (vs Variables) Has(name string) bool {
	_, ok := vs[name]
	return ok
}

// String returns a String (or Xml) variable's text.
func (vs Variables) String(name string) (string, error) {
	return read(vs, name, TypeString, parseString, TypeString, TypeXML)
}

// Bool returns a Boolean variable's value.
func (vs Variables) Bool(name string) (bool, error) {
	return read(vs, name, TypeBoolean, parseBool, TypeBoolean)
}

// integer reads a Short, Integer or Long variable as an integer of at most
// maxBits, from its exact text and within its declared type's range.
func (vs Variables) integer(name, want string, maxBits int) (int64, error) {
	v, canonical, verr := vs.lookup(name, want, TypeShort, TypeInteger, TypeLong)
	if verr != nil {
		return 0, verr
	}
	bits, rangeName := bitsOf(canonical), canonical
	if bits > maxBits {
		bits, rangeName = maxBits, want
	}
	n, err := parseInt(v.rawValue(), bits, rangeName)
	if err != nil {
		return 0, fail(name, v, want, err)
	}
	return n, nil
}

// Long returns a Long, Integer or Short variable as int64. The value is
// read from its exact JSON text, so Longs beyond 2^53 keep every digit; a
// fraction or exponent is malformed, and so is a value outside the
// declared type's range. A JSON string holding an integer is accepted, as
// the engine's Jackson also coerces it.
func (vs Variables) Long(name string) (int64, error) {
	return vs.integer(name, TypeLong, 64)
}

// Integer returns an Integer or Short variable, or a Long within the int32
// range, as int32. Outside that range it reports ErrVariableValue.
func (vs Variables) Integer(name string) (int32, error) {
	n, err := vs.integer(name, TypeInteger, 32)
	return int32(n), err
}

// Double returns a Double variable, or a Short, Integer or Long converted
// to float64 (which rounds integers beyond 2^53). Jackson's "NaN" and
// "Infinity" strings read as the corresponding float64 values.
func (vs Variables) Double(name string) (float64, error) {
	v, canonical, verr := vs.lookup(name, TypeDouble, TypeDouble, TypeShort, TypeInteger, TypeLong)
	if verr != nil {
		return 0, verr
	}
	if canonical != TypeDouble {
		n, err := parseInt(v.rawValue(), bitsOf(canonical), canonical)
		if err != nil {
			return 0, fail(name, v, TypeDouble, err)
		}
		return float64(n), nil
	}
	f, err := parseDouble(v.rawValue())
	if err != nil {
		return 0, fail(name, v, TypeDouble, err)
	}
	return f, nil
}

// Date returns a Date variable's time, with the offset the engine printed
// (the server JVM's default zone).
func (vs Variables) Date(name string) (time.Time, error) {
	return read(vs, name, TypeDate, parseDate, TypeDate)
}

// Bytes returns a Bytes variable's data, decoded from base64.
func (vs Variables) Bytes(name string) ([]byte, error) {
	return read(vs, name, TypeBytes, parseBytes, TypeBytes)
}

// JSON unmarshals a Json variable, or an Object variable serialized as
// application/json, into dst with encoding/json. An Object in another
// serialization format (e.g. Java serialization) reports ErrVariableType.
// If the JSON does not fit dst the error wraps ErrVariableValue and, for
// errors.As, the encoding/json error, whose text is not printed because it
// can quote the value.
func (vs Variables) JSON(name string, dst any) error {
	v, canonical, verr := vs.lookup(name, TypeJSON, TypeJSON, TypeObject)
	if verr != nil {
		return verr
	}
	text, err := jsonText(v, canonical)
	if err != nil {
		return fail(name, v, TypeJSON, err)
	}
	if err := json.Unmarshal(text, dst); err != nil {
		return fail(name, v, TypeJSON, jsonDecodeError(err, dst))
	}
	return nil
}

// jsonDecodeError turns an encoding/json error into one whose message
// names the Go type and JSON kind involved but not the data.
func jsonDecodeError(err error, dst any) error {
	var invalid *json.InvalidUnmarshalError
	if errors.As(err, &invalid) {
		return err // a programming error about dst; it contains no data
	}
	reason := fmt.Sprintf("JSON does not decode into %T", dst)
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		kind, _, _ := strings.Cut(typeErr.Value, " ") // "number 5" -> "number"
		reason = fmt.Sprintf("cannot decode a JSON %s into Go type %v", kind, typeErr.Type)
		if typeErr.Field != "" {
			reason += " at field " + typeErr.Field
		}
	}
	return &valueError{sentinel: ErrVariableValue, reason: reason, cause: err}
}

// File returns a File variable's metadata, and its content if the
// response carried one (the engine normally omits it). A File with a null
// value is not an error here, since that is how the engine sends files.
func (vs Variables) File(name string) (FileValue, error) {
	v, ok := vs[name]
	if !ok {
		return FileValue{}, &VariableError{Name: name, Want: TypeFile, Err: ErrVariableMissing}
	}
	switch canonicalType(v.Type) {
	case TypeFile:
	case TypeNull:
		return FileValue{}, &VariableError{Name: name, Type: v.Type, Want: TypeFile, Err: ErrVariableNull}
	default:
		return FileValue{}, &VariableError{Name: name, Type: v.Type, Want: TypeFile, Err: ErrVariableType}
	}
	fv, err := parseFile(v)
	if err != nil {
		return FileValue{}, fail(name, v, TypeFile, err)
	}
	return fv, nil
}

// Value returns the named variable decoded as by Variable.Decode, for
// callers that handle several types.
func (vs Variables) Value(name string) (any, error) {
	v, ok := vs[name]
	if !ok {
		return nil, &VariableError{Name: name, Err: ErrVariableMissing}
	}
	val, err := v.decode()
	if err != nil {
		return nil, &VariableError{Name: name, Type: v.Type, Err: err}
	}
	return val, nil
}

// checkContent reports, as a request the client refuses to send (ErrInvalidArgument and
// ErrNotSent), the first File variable in sets without content, by sorted name, as a
// *VariableError wrapping ErrNoContent. The engine would answer it with a 500
// ("Provided value is not of File, InputStream or byte[] type"), which looks like an
// engine failure rather than the handler's mistake. A Bytes variable with a null value
// passes: the engine accepts it (a null Bytes, whose data reads as empty).
func checkContent(op string, sets ...Variables) error {
	for _, vs := range sets {
		for _, name := range slices.Sorted(maps.Keys(vs)) {
			v := vs[name]
			if canonicalType(v.Type) == TypeFile && v.err == nil && v.isNull() {
				return &argError{op: op, err: fmt.Errorf("encode request: %w", &VariableError{Name: name, Type: v.Type, Err: ErrNoContent})}
			}
		}
	}
	return nil
}

// VariableData downloads the content of a process instance's File or Bytes variable
// (GET /process-instance/{id}/variables/{name}/data), which fetchAndLock and the
// variable queries do not send for Files. The content is read whole, so it is bounded
// by Config.MaxResponseBytes (ErrResponseTooLarge beyond it).
//
// Errors: ErrNotFound when the instance has no such variable (it may live in a narrower
// scope: see LocalVariableData) or the instance does not exist (the engine's 500 for an
// unknown instance is reported as ErrNotFound too); ErrBadRequest when the variable is
// neither File nor Bytes. The variable's content never appears in an error.
func (c *Client) VariableData(ctx context.Context, processInstanceID, name string) ([]byte, error) {
	op := fmt.Sprintf("get content of variable %q of process instance %s", name, processInstanceID)
	if processInstanceID == "" || name == "" {
		return nil, invalid(op, "process instance id and variable name are required")
	}
	return c.variableData(ctx, op, "/process-instance/"+url.PathEscape(processInstanceID)+"/variables/"+url.PathEscape(name)+"/data")
}

// LocalVariableData downloads the content of a File or Bytes variable local to an
// execution (GET /execution/{id}/localVariables/{name}/data): a variable of the
// external task's own scope (an input mapping, or a variable set locally). Errors as for
// VariableData; ErrNotFound when the execution has no such local variable.
func (c *Client) LocalVariableData(ctx context.Context, executionID, name string) ([]byte, error) {
	op := fmt.Sprintf("get content of local variable %q of execution %s", name, executionID)
	if executionID == "" || name == "" {
		return nil, invalid(op, "execution id and variable name are required")
	}
	return c.variableData(ctx, op, "/execution/"+url.PathEscape(executionID)+"/localVariables/"+url.PathEscape(name)+"/data")
}

func (c *Client) variableData(ctx context.Context, op, path string) ([]byte, error) {
	var s string // the body as it came, whatever its content type
	err := c.do(ctx, call{op: op, method: http.MethodGet, path: path, out: &s})
	if e, ok := err.(*Error); ok && e.StatusCode == http.StatusInternalServerError && strings.HasSuffix(e.Message, "doesn't exist: execution is null") {
		// The engine's answer for an unknown process instance or execution.
		e.kind = ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	return []byte(s), nil
}
