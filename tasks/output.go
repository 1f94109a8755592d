package tasks

import (
	"encoding"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
)

// MaxStringLength is the most characters (Unicode code points) a String variable holds:
// the engine stores one in a varchar(4000) column, and refuses a longer one, or one with
// a NUL character, with 500 ProcessEnginePersistenceException when the task is
// completed, which then ends in an incident (camunda7's conformance suite pins it).
// VariablesFrom and BPMNError refuse such a string, naming the variable; write long text
// as a Json variable (a json.RawMessage, struct or map field) or a Bytes one.
const MaxStringLength = 4000

// stringVar is a String variable, or why the engine would refuse it.
func stringVar(s string) (camunda7.Variable, error) {
	if strings.ContainsRune(s, 0) {
		return camunda7.Variable{}, errors.New("String holds a NUL character, which the engine's database refuses")
	}
	if n := utf8.RuneCountInString(s); n > MaxStringLength {
		return camunda7.Variable{}, fmt.Errorf("String of %d characters: the engine stores at most %d (tasks.MaxStringLength); write long text as Json or Bytes", n, MaxStringLength)
	}
	return camunda7.StringVar(s), nil
}

// doubleVar is a Double variable, or why JSON cannot carry it.
func doubleVar(f float64) (camunda7.Variable, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return camunda7.Variable{}, fmt.Errorf("Double %v: JSON, and so the engine, carries no NaN or infinity", f)
	}
	return camunda7.DoubleVar(f), nil
}

// anyVar writes a value toVariables has no case for: a pointer as what it points to (nil:
// a null), anything else as Json.
func anyVar(x any) (camunda7.Variable, error) {
	v := reflect.ValueOf(x)
	if v.Kind() != reflect.Pointer {
		return camunda7.JSONVar(x)
	}
	if v.IsNil() {
		return camunda7.NullVar(), nil
	}
	w, err := writerFor(v.Type())
	if err != nil {
		return camunda7.Variable{}, err
	}
	return w(v)
}

// toVariables converts BPMN error variables (failure is standard-library only, so it
// carries plain values) into typed engine variables. A camunda7.Variable passes as is.
func toVariables(in map[string]any) (camunda7.Variables, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := camunda7.Variables{}
	for k, v := range in {
		var err error
		switch x := v.(type) {
		case camunda7.Variable:
			out[k] = x
		case nil:
			out[k] = camunda7.NullVar()
		case string:
			out[k], err = stringVar(x)
		case bool:
			out[k] = camunda7.BoolVar(x)
		case int:
			out[k] = camunda7.LongVar(int64(x))
		case int32:
			out[k] = camunda7.IntegerVar(x)
		case int64:
			out[k] = camunda7.LongVar(x)
		case float64:
			out[k], err = doubleVar(x)
		case float32:
			out[k], err = doubleVar(float64(x))
		case time.Time:
			out[k] = camunda7.DateVar(x)
		case []byte:
			out[k] = camunda7.BytesVar(x)
		case time.Duration:
			err = errors.New("time.Duration: no engine type holds a duration; write an int64 or a string")
		default:
			out[k], err = anyVar(x)
		}
		if err != nil {
			return nil, fmt.Errorf("variable %q: %w", k, err)
		}
	}
	return out, nil
}

// VariablesFrom returns the variables a struct holds, one per field with a var tag
// (BindTag): the mirror of Task.Bind, with the same tags. Return them from a handler to
// complete the task with them, or pass them to BPMNError. src is a struct or a non-nil
// pointer to one. The field's Go type picks the variable's type:
//
//   - string (and named string types): String, of at most MaxStringLength characters
//     and no NUL (the engine's database refuses others: write long text as Json);
//   - bool: Boolean;
//   - int8, int16: Short; int32: Integer; int, int64 and unsigned integers: Long (an
//     unsigned value above the Long range is an error);
//   - float32, float64: Double, not NaN nor infinite (JSON carries neither);
//   - time.Time: Date;
//   - []byte: Bytes;
//   - a type that implements encoding.TextMarshaler (netip.Addr, a UUID type, ...):
//     String, its text;
//   - structs, maps, slices, arrays: Json, encoded with encoding/json; json.RawMessage:
//     Json as it is;
//   - camunda7.Variable: as it is;
//   - any: by the value's dynamic type, as BPMN error variables are converted (a
//     time.Duration is refused there too; a pointer writes what it points to, nil a
//     null);
//   - a pointer to any of these: a nil pointer writes a null variable.
//
// An embedded struct with a tag is one Json variable, its fields' tags unread (as Bind
// reads it); two fields naming the same variable are an error (Bind reads both, but one
// variable holds one value).
//
// A field tagged optional is left out when it holds its zero value (a nil pointer, an
// empty string, 0); without optional a zero value is written. Fields without the tag
// are left out. Every field that cannot be written is named at once, in an error marked
// failure.Permanent ("tasks: write variables from main.Out: field Note: String of 4001
// characters: ..."): a type no variable holds (time.Duration, channels, functions), an
// unexported field, a bad or repeated tag, a value the engine would refuse.
func VariablesFrom(src any) (camunda7.Variables, error) {
	v := reflect.ValueOf(src)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil, failure.Permanent(fmt.Errorf("tasks: VariablesFrom needs a struct or a non-nil pointer to one, got %T", src))
	}
	p, err := planOf(v.Type())
	if err != nil {
		if be, ok := err.(*bindErrors); ok {
			err = &bindErrors{typ: be.typ, errs: be.errs, verb: "write variables from"}
		}
		return nil, failure.Permanent(err)
	}
	out := make(camunda7.Variables, len(p.fields))
	var errs []*BindError
	for _, f := range p.fields {
		fv := v.FieldByIndex(f.index)
		if f.optional && fv.IsZero() {
			continue
		}
		if f.writeErr != nil {
			errs = append(errs, &BindError{Field: f.field, Variable: f.name, Err: f.writeErr})
			continue
		}
		x, err := f.write(fv)
		if err != nil {
			errs = append(errs, &BindError{Field: f.field, Variable: f.name, Err: err})
			continue
		}
		out[f.name] = x
	}
	if len(errs) > 0 {
		return nil, failure.Permanent(&bindErrors{typ: v.Type(), errs: errs, verb: "write variables from"})
	}
	return out, nil
}

// BPMNError is failure.BPMNError with its variables written from vars: a struct or a
// pointer to one, as VariablesFrom writes it; a camunda7.Variables, as it is; a
// map[string]any, converted as failure.BPMNError's variables are. vars nil, or a nil
// pointer, sends none. Variables that cannot be written (or a vars of another type) make
// it a permanent failure naming them instead, so that the handler's mistake raises an
// incident that says so.
func BPMNError(code, message string, vars any) error {
	var m map[string]any
	switch x := vars.(type) {
	case nil:
	case camunda7.Variables:
		m = make(map[string]any, len(x))
		for k, v := range x {
			m[k] = v
		}
	case map[string]any:
		// Convert now, so that a bad value is refused here, naming it.
		vs, err := toVariables(x)
		if err != nil {
			return failure.Permanent(fmt.Errorf("BPMN error %q: tasks: write variables: %w", code, err))
		}
		m = make(map[string]any, len(vs))
		for k, v := range vs {
			m[k] = v
		}
	default:
		if v := reflect.ValueOf(vars); v.Kind() == reflect.Pointer && v.IsNil() {
			break
		}
		vs, err := VariablesFrom(vars)
		if err != nil {
			return fmt.Errorf("BPMN error %q: %w", code, err)
		}
		m = make(map[string]any, len(vs))
		for k, x := range vs {
			m[k] = x
		}
	}
	return failure.BPMNError(code, message, m)
}

// writer turns a field's value into a variable.
type writer func(v reflect.Value) (camunda7.Variable, error)

var textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()

// writerFor returns the writer for a field of type t, or why there is none.
func writerFor(t reflect.Type) (writer, error) {
	switch {
	case t == variableType:
		return func(v reflect.Value) (camunda7.Variable, error) { return v.Interface().(camunda7.Variable), nil }, nil
	case t == timeType:
		return func(v reflect.Value) (camunda7.Variable, error) {
			return camunda7.DateVar(v.Interface().(time.Time)), nil
		}, nil
	case t == durationType:
		return nil, errors.New("time.Duration: no engine type holds a duration; write an int64 or a string")
	case t == rawJSONType:
		return func(v reflect.Value) (camunda7.Variable, error) { return camunda7.JSONRawVar(v.Bytes()) }, nil
	case t.Kind() == reflect.Pointer:
		// Before the text case: *time.Time and *netip.Addr have the value's methods, and a
		// nil one is a null.
		if t.Elem().Kind() != reflect.Pointer {
			return writerForPointer(t)
		}
	case t.Implements(textMarshaler) || reflect.PointerTo(t).Implements(textMarshaler):
		return writeText, nil
	}
	return writerForKind(t)
}

// writerForKind returns the writer for a field of type t by its kind.
func writerForKind(t reflect.Type) (writer, error) {
	switch t.Kind() {
	case reflect.String:
		return func(v reflect.Value) (camunda7.Variable, error) { return stringVar(v.String()) }, nil
	case reflect.Bool:
		return func(v reflect.Value) (camunda7.Variable, error) { return camunda7.BoolVar(v.Bool()), nil }, nil
	case reflect.Int8, reflect.Int16:
		return func(v reflect.Value) (camunda7.Variable, error) { return camunda7.ShortVar(int16(v.Int())), nil }, nil
	case reflect.Int32:
		return func(v reflect.Value) (camunda7.Variable, error) { return camunda7.IntegerVar(int32(v.Int())), nil }, nil
	case reflect.Int, reflect.Int64:
		return func(v reflect.Value) (camunda7.Variable, error) { return camunda7.LongVar(v.Int()), nil }, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return writeUint, nil
	case reflect.Float32, reflect.Float64:
		return func(v reflect.Value) (camunda7.Variable, error) { return doubleVar(v.Float()) }, nil
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return func(v reflect.Value) (camunda7.Variable, error) { return camunda7.BytesVar(v.Bytes()), nil }, nil
		}
		return writeJSON, nil
	case reflect.Struct, reflect.Map, reflect.Array:
		return writeJSON, nil
	case reflect.Interface:
		if t.NumMethod() == 0 {
			return writeAny, nil
		}
	case reflect.Pointer:
		if t.Elem().Kind() != reflect.Pointer {
			return writerForPointer(t)
		}
	}
	return nil, fmt.Errorf("%v: no variable type holds it", t)
}

// writerForPointer writes a nil pointer as a null variable, and else what it points to.
func writerForPointer(t reflect.Type) (writer, error) {
	inner, err := writerFor(t.Elem())
	if err != nil {
		return nil, err
	}
	return func(v reflect.Value) (camunda7.Variable, error) {
		if v.IsNil() {
			return camunda7.NullVar(), nil
		}
		return inner(v.Elem())
	}, nil
}

// writeText writes the text of a value whose type, or pointer type, is an
// encoding.TextMarshaler (as Bind parses it with its pointer's UnmarshalText).
func writeText(v reflect.Value) (camunda7.Variable, error) {
	p := reflect.New(v.Type())
	p.Elem().Set(v)
	b, err := p.Interface().(encoding.TextMarshaler).MarshalText()
	if err != nil {
		return camunda7.Variable{}, fmt.Errorf("%v does not marshal as text: %w", v.Type(), err)
	}
	return stringVar(string(b))
}

func writeUint(v reflect.Value) (camunda7.Variable, error) {
	n := v.Uint()
	if n > math.MaxInt64 {
		return camunda7.Variable{}, fmt.Errorf("%d: out of the range of a Long", n)
	}
	return camunda7.LongVar(int64(n)), nil
}

func writeJSON(v reflect.Value) (camunda7.Variable, error) { return camunda7.JSONVar(v.Interface()) }

func writeAny(v reflect.Value) (camunda7.Variable, error) {
	vs, err := toVariables(map[string]any{"v": v.Interface()})
	if err != nil {
		return camunda7.Variable{}, errors.Unwrap(err)
	}
	return vs["v"], nil
}
