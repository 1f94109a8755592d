package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/tasks"
	"github.com/extworker/extworker/tasks/taskstest"
)

type address struct {
	City string `json:"city"`
	Zip  string `json:"zip"`
}

type Common struct {
	Tenant string `var:"tenant"`
}

type everything struct {
	Common          // promoted fields bind too
	S        string `var:"s"`
	B        bool   `var:"b"`
	I        int    `var:"i"`
	I8       int8   `var:"i8"`
	I64      int64  `var:"i64"`
	U        uint32 `var:"u"`
	F        float64
	F64      float64           `var:"f64"`
	F32      float32           `var:"f32"`
	FromInt  float64           `var:"i"` // a Long read as a float
	When     time.Time         `var:"when"`
	Data     []byte            `var:"data"`
	Addr     address           `var:"address"`
	M        map[string]int    `var:"counts"`
	List     []string          `var:"list"`
	Raw      json.RawMessage   `var:"address"`
	Var      camunda7.Variable `var:"s"`
	Any      any               `var:"i64"`
	IP       netip.Addr        `var:"ip"`
	Ptr      *string           `var:"s"`
	NilPtr   *string           `var:"absent,optional"`
	Named    currency          `var:"currency"`
	Ignored  string            `var:"-"`
	Untagged string
	Object   map[string]any `var:"object"`
}

type currency string

func bindRun(t *testing.T, dst any, vars camunda7.Variables, opts ...tasks.TopicOptions) (taskstest.Result, error) {
	t.Helper()
	var bindErr error
	res := taskstest.Run(t, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		bindErr = tk.Bind(dst)
		return nil, bindErr
	}, taskstest.Task{Topic: "bind", Variables: vars}, opts...)
	return res, bindErr
}

// Every supported field type is bound from the variable type the engine sends for it.
func TestBindTypes(t *testing.T) {
	when := time.Date(2024, 5, 17, 9, 30, 0, 0, time.UTC)
	obj, err := camunda7.ObjectVar("java.util.HashMap", map[string]any{"k": "v"})
	require.NoError(t, err)
	addr, err := camunda7.JSONVar(address{City: "Ghent", Zip: "9000"})
	require.NoError(t, err)
	counts, err := camunda7.JSONVar(map[string]int{"a": 1})
	require.NoError(t, err)
	list, err := camunda7.JSONVar([]string{"x", "y"})
	require.NoError(t, err)
	vars := camunda7.Variables{
		"tenant": camunda7.StringVar("acme"), "s": camunda7.StringVar("text"), "b": camunda7.BoolVar(true),
		"i": camunda7.IntegerVar(7), "i8": camunda7.ShortVar(-5), "i64": camunda7.LongVar(1 << 62), "u": camunda7.LongVar(4_000_000_000),
		"f64": camunda7.DoubleVar(2.5), "f32": camunda7.DoubleVar(0.25), "when": camunda7.DateVar(when), "data": camunda7.BytesVar([]byte{0, 1, 2}),
		"address": addr, "counts": counts, "list": list, "ip": camunda7.StringVar("192.0.2.1"), "currency": camunda7.StringVar("EUR"),
		"object": obj, "absent": camunda7.NullVar(),
	}
	in := everything{Ignored: "kept", Untagged: "kept", F: 9}
	res, bindErr := bindRun(t, &in, vars)
	require.NoError(t, bindErr)
	assert.Equal(t, tasks.OutcomeCompleted, res.Outcome)

	assert.Equal(t, "acme", in.Tenant)
	assert.Equal(t, "text", in.S)
	assert.True(t, in.B)
	assert.Equal(t, 7, in.I)
	assert.EqualValues(t, -5, in.I8)
	assert.EqualValues(t, 1<<62, in.I64)
	assert.EqualValues(t, 4_000_000_000, in.U)
	assert.Equal(t, 2.5, in.F64)
	assert.EqualValues(t, 0.25, in.F32)
	assert.Equal(t, 7.0, in.FromInt)
	assert.True(t, when.Equal(in.When), "%v", in.When)
	assert.Equal(t, []byte{0, 1, 2}, in.Data)
	assert.Equal(t, address{City: "Ghent", Zip: "9000"}, in.Addr)
	assert.Equal(t, map[string]int{"a": 1}, in.M)
	assert.Equal(t, []string{"x", "y"}, in.List)
	assert.JSONEq(t, `{"city":"Ghent","zip":"9000"}`, string(in.Raw))
	assert.Equal(t, camunda7.TypeString, in.Var.Type)
	assert.EqualValues(t, int64(1<<62), in.Any)
	assert.Equal(t, netip.MustParseAddr("192.0.2.1"), in.IP)
	require.NotNil(t, in.Ptr)
	assert.Equal(t, "text", *in.Ptr)
	assert.Nil(t, in.NilPtr, "an optional null variable leaves the field alone")
	assert.Equal(t, currency("EUR"), in.Named)
	assert.Equal(t, map[string]any{"k": "v"}, in.Object, "an Object serialized as JSON binds like Json")
	assert.Equal(t, "kept", in.Ignored)
	assert.Equal(t, "kept", in.Untagged)
	assert.Equal(t, 9.0, in.F, "untagged")
}

// A bad input is a permanent error naming every field and variable at once: an
// incident, not a retry loop; errors.As and errors.Is see each reason.
func TestBindErrorsArePermanentAndNameEveryVariable(t *testing.T) {
	type input struct {
		InvoiceID string    `var:"invoiceId"`
		Amount    int64     `var:"amountCents"`
		Small     int8      `var:"small"`
		Due       time.Time `var:"due"`
		Address   address   `var:"address"`
		Note      string    `var:"note,optional"`
		Flag      bool      `var:"flag,optional"`
	}
	in := input{Note: "default", Flag: true}
	res, bindErr := bindRun(t, &in, camunda7.Variables{
		"amountCents": camunda7.StringVar("12.50"), "small": camunda7.LongVar(1000), "due": camunda7.NullVar(),
		"address": camunda7.StringVar("{not json var}"), "flag": camunda7.NullVar(), "secret-looking": camunda7.StringVar("4111"),
	})
	require.Error(t, bindErr)
	assert.Equal(t, failure.KindPermanent, failure.Classify(bindErr).Kind)
	assert.ErrorIs(t, bindErr, camunda7.ErrVariableMissing)
	assert.ErrorIs(t, bindErr, camunda7.ErrVariableType)
	assert.ErrorIs(t, bindErr, camunda7.ErrVariableNull)
	assert.ErrorIs(t, bindErr, camunda7.ErrVariableValue)
	var be *tasks.BindError
	require.ErrorAs(t, bindErr, &be)
	assert.Equal(t, "InvoiceID", be.Field)
	assert.Equal(t, "invoiceId", be.Variable)

	assert.Equal(t, tasks.OutcomeIncident, res.Outcome)
	assert.Equal(t, "permanent", res.Classification)
	require.NotNil(t, res.Failure)
	assert.Equal(t, 0, res.Failure.Retries)
	msg := res.Failure.Message
	for _, want := range []string{
		"permanent: tasks: bind task variables to tasks_test.input: ",
		`field InvoiceID: camunda7: variable "invoiceId": missing`,
		`field Amount: camunda7: variable "amountCents": has type String, want Long`,
		`field Small: camunda7: variable "small" (type Long): variable value malformed: out of the range of Go type int8`,
		`field Due: camunda7: variable "due" (type Null): variable is null`,
		`field Address: camunda7: variable "address": has type String, want Json`,
	} {
		assert.Contains(t, msg, want)
	}
	assert.NotContains(t, msg, "12.50", "values never appear in errors")
	assert.NotContains(t, msg, "Note")
	assert.NotContains(t, msg, "Flag")
	assert.Equal(t, "default", in.Note, "an optional missing variable leaves the field alone")
	assert.True(t, in.Flag, "an optional null variable leaves the field alone")
}

// A required variable that the topic does not fetch is reported with what to change.
func TestBindNamesVariablesTheTopicDoesNotFetch(t *testing.T) {
	type input struct {
		A string `var:"a"`
		B string `var:"b"`
	}
	vars := camunda7.Variables{"a": camunda7.StringVar("A"), "b": camunda7.StringVar("B")}
	var in input
	_, bindErr := bindRun(t, &in, vars, tasks.TopicOptions{Variables: []string{"a"}})
	require.Error(t, bindErr)
	assert.Contains(t, bindErr.Error(), `field B: camunda7: variable "b": missing (the topic does not fetch it: list it in TopicOptions.Variables, e.g. with tasks.VariablesOf)`)
	assert.Equal(t, "A", in.A)

	in = input{}
	res, bindErr := bindRun(t, &in, vars, tasks.TopicOptions{Variables: tasks.VariablesOf[input]()})
	require.NoError(t, bindErr)
	assert.Equal(t, input{A: "A", B: "B"}, in)
	assert.Equal(t, []string{"a", "b"}, res.Fetch.Variables)
}

// Mistakes in the struct are reported, as permanent errors naming the field, before any
// variable is read.
func TestBindRefusesWhatItCannotFill(t *testing.T) {
	type unexported struct {
		x string `var:"x"` //nolint:unused // the mistake under test
	}
	type badOption struct {
		X string `var:"x,required"`
	}
	type emptyName struct {
		X string `var:",optional"`
	}
	type duration struct {
		D time.Duration `var:"d"`
	}
	type channel struct {
		C chan int `var:"c"`
	}
	type Inner struct {
		V string `var:"v"`
	}
	type viaPointer struct {
		*Inner
	}
	var s string
	cases := []struct {
		name string
		dst  any
		want string
	}{
		{"not a pointer", struct{}{}, "Bind needs a non-nil pointer to a struct, got struct {}"},
		{"nil pointer", (*badOption)(nil), "non-nil pointer"},
		{"pointer to a non-struct", &s, "got *string"},
		{"unexported", &unexported{}, "field x: unexported: Bind cannot set it"},
		{"unknown option", &badOption{}, `field X: tag var:"x,required": unknown option "required"`},
		{"no name", &emptyName{}, `field X: tag var:",optional": no variable name`},
		{"duration", &duration{}, "field D: time.Duration: no engine type holds a duration"},
		{"channel", &channel{}, "field C: chan int: no variable type binds to it"},
		{"embedded pointer", &viaPointer{}, "field Inner.V: promoted through an embedded pointer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, bindErr := bindRun(t, tc.dst, camunda7.Variables{"x": camunda7.StringVar("X")})
			require.Error(t, bindErr)
			assert.Contains(t, bindErr.Error(), tc.want)
			assert.Equal(t, failure.KindPermanent, failure.Classify(bindErr).Kind)
			assert.Equal(t, tasks.OutcomeIncident, res.Outcome)
		})
	}
}

// VariablesOf lists the variables a struct binds, in field order, once each, and panics
// at registration for a struct Bind cannot fill.
func TestVariablesOf(t *testing.T) {
	assert.Equal(t, []string{"tenant", "s", "b", "i", "i8", "i64", "u", "f64", "f32", "when", "data", "address", "counts", "list",
		"ip", "absent", "currency", "object"}, tasks.VariablesOf[everything]())
	assert.Equal(t, tasks.VariablesOf[everything](), tasks.VariablesOf[*everything]())
	assert.Empty(t, tasks.VariablesOf[struct{ X int }]())
	assert.PanicsWithValue(t, "tasks.VariablesOf[string]: not a struct", func() { tasks.VariablesOf[string]() })
	assert.Panics(t, func() {
		tasks.VariablesOf[struct {
			D time.Duration `var:"d"`
		}]()
	})
}

// Bind's errors, like the accessors', never print a value.
func TestBindTextUnmarshalerErrorHidesTheValue(t *testing.T) {
	type input struct {
		IP netip.Addr `var:"ip"`
	}
	var in input
	_, bindErr := bindRun(t, &in, camunda7.Variables{"ip": camunda7.StringVar("secret-host")})
	require.Error(t, bindErr)
	assert.Contains(t, bindErr.Error(), `variable "ip" (type String): variable value malformed: does not parse as netip.Addr`)
	assert.NotContains(t, bindErr.Error(), "secret-host")
	assert.True(t, errors.Is(bindErr, camunda7.ErrVariableValue))
}
