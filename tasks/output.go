package tasks

import (
	"encoding"
	"errors"
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
)

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
			out[k] = camunda7.StringVar(x)
		case bool:
			out[k] = camunda7.BoolVar(x)
		case int:
			out[k] = camunda7.LongVar(int64(x))
		case int32:
			out[k] = camunda7.IntegerVar(x)
		case int64:
			out[k] = camunda7.LongVar(x)
		case float64:
			out[k] = camunda7.DoubleVar(x)
		case time.Time:
			out[k] = camunda7.DateVar(x)
		case []byte:
			out[k] = camunda7.BytesVar(x)
		default:
			out[k], err = camunda7.JSONVar(x)
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
//   - string (and named string types): String;
//   - bool: Boolean;
//   - int8, int16: Short; int32: Integer; int, int64 and unsigned integers: Long (an
//     unsigned value above the Long range is an error);
//   - float32, float64: Double;
//   - time.Time: Date;
//   - []byte: Bytes;
//   - a type that implements encoding.TextMarshaler (netip.Addr, a UUID type, ...):
//     String, its text;
//   - structs, maps, slices, arrays: Json, encoded with encoding/json; json.RawMessage:
//     Json as it is;
//   - camunda7.Variable: as it is;
//   - any: by the value's dynamic type, as BPMN error variables are converted;
//   - a pointer to any of these: a nil pointer writes a null variable.
//
// A field tagged optional is left out when it holds its zero value (a nil pointer, an
// empty string, 0); without optional a zero value is written. Fields without the tag
// are left out. The errors are those of Bind's: a type no variable holds
// (time.Duration, channels, functions), an unexported field, a bad tag, all named at
// once, marked failure.Permanent.
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

// BPMNError is failure.BPMNError with its variables written from a struct, as
// VariablesFrom writes them (vars nil: none). A struct that cannot be written makes it a
// permanent failure naming the fields instead.
func BPMNError(code, message string, vars any) error {
	if vars == nil {
		return failure.BPMNError(code, message, nil)
	}
	vs, err := VariablesFrom(vars)
	if err != nil {
		return fmt.Errorf("BPMN error %q: %w", code, err)
	}
	m := make(map[string]any, len(vs))
	for k, x := range vs {
		m[k] = x
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
	case t.Implements(textMarshaler):
		return writeText, nil
	}
	return writerForKind(t)
}

// writerForKind returns the writer for a field of type t by its kind.
func writerForKind(t reflect.Type) (writer, error) {
	switch t.Kind() {
	case reflect.String:
		return func(v reflect.Value) (camunda7.Variable, error) { return camunda7.StringVar(v.String()), nil }, nil
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
		return func(v reflect.Value) (camunda7.Variable, error) { return camunda7.DoubleVar(v.Float()), nil }, nil
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

func writeText(v reflect.Value) (camunda7.Variable, error) {
	b, err := v.Interface().(encoding.TextMarshaler).MarshalText()
	if err != nil {
		return camunda7.Variable{}, fmt.Errorf("%v does not marshal as text: %w", v.Type(), err)
	}
	return camunda7.StringVar(string(b)), nil
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
