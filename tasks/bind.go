package tasks

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
)

// BindTag is the struct tag that Task.Bind and VariablesOf read:
//
//	InvoiceID string     `var:"invoiceId"`          // required: missing or null is an error
//	Note      string     `var:"note,optional"`      // missing or null leaves the field as it is
//	Order     Order      `var:"order"`              // a Json variable, decoded with encoding/json
//	Internal  string     `var:"-"`                  // not bound (nor is a field without the tag)
const BindTag = "var"

// Bind copies the task's variables into the struct dst points to, one field per var tag
// (BindTag), and returns every variable that is missing or does not fit its field at
// once. The field's Go type picks the accessor, and with it the variable types accepted:
//
//   - string (and named string types): String or Xml;
//   - bool: Boolean;
//   - int, int8 … int64, uint … uint64: Short, Integer or Long, within the field's range;
//   - float32, float64: Double, or an integer type;
//   - time.Time: Date;
//   - []byte: Bytes;
//   - a type whose pointer implements encoding.TextUnmarshaler (netip.Addr, a UUID
//     type, ...): String, parsed with UnmarshalText;
//   - structs, maps, slices, arrays and json.RawMessage: Json, or an Object serialized as
//     application/json, decoded with encoding/json (so nested json tags apply);
//   - camunda7.Variable: the variable as the engine sent it, null included;
//   - any: the value as camunda7.Variable.Decode returns it;
//   - a pointer to any of these: set to a new value when the variable is present.
//
// An embedded struct with a tag is one variable (Json), as encoding/json treats a tagged
// embedded field: the tags of its own fields are not read; without a tag its fields'
// tags are read as the outer struct's. Two fields may read the same variable.
//
// A variable that is missing, or null, is an error unless the tag says optional; then
// the field keeps its value (so set defaults before calling Bind). Fields without the
// tag are left alone. time.Duration, channels, functions and unexported fields are
// refused: for them, and for a dst that is not a non-nil pointer to a struct, Bind
// reports the programming error instead of binding anything.
//
// The error is marked failure.Permanent: returned from the handler as it is, a bad input
// raises an incident at once, with a message that names every field and variable
// ("tasks: bind task variables to main.Invoice: field Amount: camunda7: variable
// "amountCents": has type String, want Long"), instead of cycling through retries that
// cannot succeed. errors.As finds a *BindError, errors.Is the camunda7.ErrVariable*
// reason. Variable values never appear in the error.
//
// Only fetched variables can be bound: name them in TopicOptions.Variables, for example
// with VariablesOf. A required variable the topic does not fetch is reported with that
// hint.
func (t *Task) Bind(dst any) error {
	v := reflect.ValueOf(dst)
	if !v.IsValid() || v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return failure.Permanent(fmt.Errorf("tasks: Bind needs a non-nil pointer to a struct, got %T", dst))
	}
	p, err := planOf(v.Elem().Type())
	if err != nil {
		return failure.Permanent(err)
	}
	s := v.Elem()
	vs := t.Variables()
	var errs []*BindError
	for _, f := range p.fields {
		err := f.read(vs, f.name, s.FieldByIndex(f.index))
		if err == nil {
			continue
		}
		absent := errors.Is(err, camunda7.ErrVariableMissing) || errors.Is(err, camunda7.ErrVariableNull)
		if absent && f.optional {
			continue
		}
		be := &BindError{Field: f.field, Variable: f.name, Err: err}
		if errors.Is(err, camunda7.ErrVariableMissing) {
			be.hint = t.notFetchedHint(f.name)
		}
		errs = append(errs, be)
	}
	if len(errs) > 0 {
		return failure.Permanent(&bindErrors{typ: s.Type(), errs: errs})
	}
	return nil
}

// notFetchedHint explains a missing variable the topic does not ask the engine for.
func (t *Task) notFetchedHint(name string) string {
	f := t.fetch
	if f == nil {
		return ""
	}
	switch {
	case f.TopicName == "" || f.AllVariables && !f.LocalVariables:
		return ""
	case f.LocalVariables && (f.AllVariables || slices.Contains(f.Variables, name)):
		return " (the topic fetches only variables local to the task's execution: TopicOptions.LocalVariables)"
	case !f.AllVariables && !slices.Contains(f.Variables, name):
		return " (the topic does not fetch it: list it in TopicOptions.Variables, e.g. with tasks.VariablesOf)"
	}
	return ""
}

// VariablesOf returns the names of the variables T's var tags (BindTag) bind, in field
// order, for TopicOptions.Variables: so that a topic fetches exactly what its handler
// binds.
//
//	type collectIn struct {
//		InvoiceID string `var:"invoiceId"`
//		Amount    int64  `var:"amountCents"`
//	}
//	reg.Register("collect-payment", collect, tasks.TopicOptions{Variables: tasks.VariablesOf[collectIn]()})
//
// T is a struct or a pointer to one. Like regexp.MustCompile it is meant for
// registration, at start-up: it panics if T is not a struct or has a field Bind cannot
// fill, naming the field.
func VariablesOf[T any]() []string {
	t := reflect.TypeFor[T]()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		panic(fmt.Sprintf("tasks.VariablesOf[%v]: not a struct", reflect.TypeFor[T]()))
	}
	p, err := planOf(t)
	if err != nil {
		panic(fmt.Sprintf("tasks.VariablesOf[%v]: %v", t, err))
	}
	names := make([]string, 0, len(p.fields))
	for _, f := range p.fields {
		if !slices.Contains(names, f.name) {
			names = append(names, f.name)
		}
	}
	return names
}

// BindError is one field Task.Bind could not fill: its variable is missing, null, of
// another type or out of the field's range (Err is then a *camunda7.VariableError), or
// the field itself cannot be bound (a programming error, found before any variable is
// read).
type BindError struct {
	// Field is the struct field, as Go names it ("Amount", "Address.City" for a field
	// of an embedded struct).
	Field string
	// Variable is the variable's name, from the tag.
	Variable string
	// Err is the reason.
	Err error

	hint string // what the topic's options have to do with it
}

// Error reads "field Amount: camunda7: variable "amountCents": has type String, want Long".
func (e *BindError) Error() string { return "field " + e.Field + ": " + e.Err.Error() + e.hint }

// Unwrap returns Err.
func (e *BindError) Unwrap() error { return e.Err }

// bindErrors is every field Bind could not fill, as one error.
type bindErrors struct {
	typ  reflect.Type
	errs []*BindError
	verb string // "bind task variables to" (Bind) or "write variables from" (VariablesFrom)
}

func (e *bindErrors) Error() string {
	var b strings.Builder
	verb := e.verb
	if verb == "" {
		verb = "bind task variables to"
	}
	fmt.Fprintf(&b, "tasks: %s %v: ", verb, e.typ)
	for i, be := range e.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(be.Error())
	}
	return b.String()
}

func (e *bindErrors) Unwrap() []error {
	out := make([]error, len(e.errs))
	for i, be := range e.errs {
		out[i] = be
	}
	return out
}

// bindPlan is how to bind one struct type: its tagged fields, in order.
type bindPlan struct {
	fields []bindField
}

type bindField struct {
	index    []int
	field    string // Go name, dotted for promoted fields
	name     string // the variable
	optional bool
	read     reader
	write    writer // VariablesFrom's
	writeErr error  // why the field cannot be written, for VariablesFrom only
}

// reader reads the variable name from vs into dst (a settable field).
type reader func(vs camunda7.Variables, name string, dst reflect.Value) error

var plans sync.Map // reflect.Type -> planResult

type planResult struct {
	p   *bindPlan
	err error
}

// planOf returns the plan for the struct type t, built once per type.
func planOf(t reflect.Type) (*bindPlan, error) {
	if r, ok := plans.Load(t); ok {
		return r.(planResult).p, r.(planResult).err
	}
	p, err := buildPlan(t)
	plans.Store(t, planResult{p, err})
	return p, err
}

func buildPlan(t reflect.Type) (*bindPlan, error) {
	p := &bindPlan{}
	var errs []*BindError
	var tagged [][]int            // embedded structs with a tag: one variable, not their fields
	byName := map[string]string{} // variable -> the field it is bound to
	for _, sf := range reflect.VisibleFields(t) {
		if slices.ContainsFunc(tagged, func(prefix []int) bool { return isPrefix(prefix, sf.Index) }) {
			continue
		}
		tag, ok := sf.Tag.Lookup(BindTag)
		if !ok || tag == "-" {
			continue
		}
		if sf.Anonymous {
			tagged = append(tagged, sf.Index)
		}
		fieldName := dottedName(t, sf.Index)
		name, opts, _ := strings.Cut(tag, ",")
		bad := func(format string, args ...any) {
			errs = append(errs, &BindError{Field: fieldName, Variable: name, Err: fmt.Errorf(format, args...)})
		}
		optional := false
		for o := range strings.SplitSeq(opts, ",") {
			switch o {
			case "":
			case "optional":
				optional = true
			default:
				bad("tag %s:%q: unknown option %q (the only option is optional)", BindTag, tag, o)
			}
		}
		switch {
		case name == "":
			bad("tag %s:%q: no variable name", BindTag, tag)
			continue
		case !sf.IsExported():
			bad("unexported: Bind cannot set it, nor VariablesFrom read it")
			continue
		case viaPointer(t, sf.Index):
			bad("promoted through an embedded pointer: embed the struct by value")
			continue
		}
		r, err := readerFor(sf.Type)
		if err != nil {
			bad("%v", err)
			continue
		}
		w, werr := writerFor(sf.Type)
		if other := byName[name]; other != "" {
			// Bind reads one variable into several fields; VariablesFrom would write it twice.
			werr = fmt.Errorf("variable %q is field %s's too: VariablesFrom writes one field per variable", name, other)
		} else {
			byName[name] = fieldName
		}
		p.fields = append(p.fields, bindField{index: sf.Index, field: fieldName, name: name, optional: optional, read: r, write: w, writeErr: werr})
	}
	if len(errs) > 0 {
		return nil, &bindErrors{typ: t, errs: errs}
	}
	return p, nil
}

// isPrefix reports whether the field index prefix leads to index (a field of the
// embedded struct at prefix).
func isPrefix(prefix, index []int) bool {
	return len(index) > len(prefix) && slices.Equal(prefix, index[:len(prefix)])
}

// dottedName names the field at index in t as Go code would reach it through embedded
// structs: "Address.City".
func dottedName(t reflect.Type, index []int) string {
	parts := make([]string, 0, len(index))
	for _, i := range index {
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		f := t.Field(i)
		parts = append(parts, f.Name)
		t = f.Type
	}
	return strings.Join(parts, ".")
}

// viaPointer reports whether the field at index is reached through an embedded pointer
// (which may be nil).
func viaPointer(t reflect.Type, index []int) bool {
	for _, i := range index[:len(index)-1] {
		t = t.Field(i).Type
		if t.Kind() == reflect.Pointer {
			return true
		}
	}
	return false
}

var (
	timeType        = reflect.TypeFor[time.Time]()
	durationType    = reflect.TypeFor[time.Duration]()
	rawJSONType     = reflect.TypeFor[json.RawMessage]()
	variableType    = reflect.TypeFor[camunda7.Variable]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// readerFor returns the reader for a field of type t, or why there is none: a named type
// with a reader of its own (readerForType), else one by kind (readerForKind).
func readerFor(t reflect.Type) (reader, error) {
	if r, ok, err := readerForType(t); ok {
		return r, err
	}
	return readerForKind(t)
}

// readerForType returns the reader of the types bound by what they are rather than by
// their kind: camunda7.Variable, time.Time, time.Duration (refused), json.RawMessage,
// and types that parse text. ok is false for any other type.
func readerForType(t reflect.Type) (r reader, ok bool, err error) {
	switch {
	case t == variableType:
		return readVariable, true, nil
	case t == timeType:
		return readTime, true, nil
	case t == durationType:
		return nil, true, errors.New("time.Duration: no engine type holds a duration; bind an int64 or a string and convert it")
	case t == rawJSONType:
		return readJSON, true, nil
	case t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(textUnmarshaler):
		return readText, true, nil
	}
	return nil, false, nil
}

// readerForKind returns the reader for a field of type t by its kind.
func readerForKind(t reflect.Type) (reader, error) {
	switch t.Kind() {
	case reflect.String:
		return readString, nil
	case reflect.Bool:
		return readBool, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return readInt, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return readUint, nil
	case reflect.Float32, reflect.Float64:
		return readFloat, nil
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return readBytes, nil
		}
		return readJSON, nil
	case reflect.Struct, reflect.Map, reflect.Array:
		return readJSON, nil
	case reflect.Interface:
		if t.NumMethod() == 0 {
			return readAny, nil
		}
	case reflect.Pointer:
		if t.Elem().Kind() != reflect.Pointer {
			return readerForPointer(t)
		}
	}
	return nil, fmt.Errorf("%v: no variable type binds to it", t)
}

// readerForPointer returns the reader for a pointer field: it sets the field to a new
// value, read by the reader of the type pointed to, when the variable is present.
func readerForPointer(t reflect.Type) (reader, error) {
	inner, err := readerFor(t.Elem())
	if err != nil {
		return nil, err
	}
	return func(vs camunda7.Variables, name string, dst reflect.Value) error {
		nv := reflect.New(t.Elem())
		if err := inner(vs, name, nv.Elem()); err != nil {
			return err
		}
		dst.Set(nv)
		return nil
	}, nil
}

// The readers, one per kind of field: each reads the variable name from vs into dst.

func readVariable(vs camunda7.Variables, name string, dst reflect.Value) error {
	v, ok := vs[name]
	if !ok {
		return &camunda7.VariableError{Name: name, Err: camunda7.ErrVariableMissing}
	}
	dst.Set(reflect.ValueOf(v))
	return nil
}

func readTime(vs camunda7.Variables, name string, dst reflect.Value) error {
	d, err := vs.Date(name)
	if err == nil {
		dst.Set(reflect.ValueOf(d))
	}
	return err
}

func readText(vs camunda7.Variables, name string, dst reflect.Value) error {
	s, err := vs.String(name)
	if err != nil {
		return err
	}
	if err := dst.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s)); err != nil {
		// The parser's message may quote the value: name only the type.
		return &camunda7.VariableError{Name: name, Type: vs[name].Type, Want: camunda7.TypeString,
			Err: fmt.Errorf("%w: does not parse as %v", camunda7.ErrVariableValue, dst.Type())}
	}
	return nil
}

func readString(vs camunda7.Variables, name string, dst reflect.Value) error {
	s, err := vs.String(name)
	if err == nil {
		dst.SetString(s)
	}
	return err
}

func readBool(vs camunda7.Variables, name string, dst reflect.Value) error {
	b, err := vs.Bool(name)
	if err == nil {
		dst.SetBool(b)
	}
	return err
}

func readInt(vs camunda7.Variables, name string, dst reflect.Value) error {
	n, err := vs.Long(name)
	if err != nil {
		return err
	}
	if dst.OverflowInt(n) {
		return outOfRange(vs, name, camunda7.TypeLong, dst.Type())
	}
	dst.SetInt(n)
	return nil
}

func readUint(vs camunda7.Variables, name string, dst reflect.Value) error {
	n, err := vs.Long(name)
	if err != nil {
		return err
	}
	if n < 0 || dst.OverflowUint(uint64(n)) {
		return outOfRange(vs, name, camunda7.TypeLong, dst.Type())
	}
	dst.SetUint(uint64(n))
	return nil
}

func readFloat(vs camunda7.Variables, name string, dst reflect.Value) error {
	f, err := vs.Double(name)
	if err != nil {
		return err
	}
	if dst.OverflowFloat(f) {
		return outOfRange(vs, name, camunda7.TypeDouble, dst.Type())
	}
	dst.SetFloat(f)
	return nil
}

func readBytes(vs camunda7.Variables, name string, dst reflect.Value) error {
	b, err := vs.Bytes(name)
	if err == nil {
		dst.SetBytes(b)
	}
	return err
}

func readAny(vs camunda7.Variables, name string, dst reflect.Value) error {
	x, err := vs.Value(name)
	if err != nil {
		return err
	}
	if x == nil {
		return &camunda7.VariableError{Name: name, Type: vs[name].Type, Err: camunda7.ErrVariableNull}
	}
	dst.Set(reflect.ValueOf(x))
	return nil
}

// readJSON decodes a Json variable (or an Object serialized as JSON) into dst.
func readJSON(vs camunda7.Variables, name string, dst reflect.Value) error {
	// Decode into a fresh value, so that a failure leaves the field as it was.
	nv := reflect.New(dst.Type())
	if err := vs.JSON(name, nv.Interface()); err != nil {
		return err
	}
	dst.Set(nv.Elem())
	return nil
}

func outOfRange(vs camunda7.Variables, name, want string, t reflect.Type) error {
	return &camunda7.VariableError{Name: name, Type: vs[name].Type, Want: want,
		Err: fmt.Errorf("%w: out of the range of Go type %v", camunda7.ErrVariableValue, t)}
}
