package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/tasks"
	"github.com/extworker/extworker/tasks/taskstest"
)

type outAddress struct {
	City string `json:"city"`
}

type allKinds struct {
	S     string            `var:"s"`
	B     bool              `var:"b"`
	I     int               `var:"i"`
	I16   int16             `var:"i16"`
	I32   int32             `var:"i32"`
	U     uint32            `var:"u"`
	F     float64           `var:"f"`
	T     time.Time         `var:"t"`
	Bytes []byte            `var:"bytes"`
	Addr  netip.Addr        `var:"addr"`
	A     outAddress        `var:"a"`
	M     map[string]int    `var:"m"`
	Raw   json.RawMessage   `var:"raw"`
	V     camunda7.Variable `var:"v"`
	Any   any               `var:"any"`
	P     *string           `var:"p"`
	Opt   string            `var:"opt,optional"`
	OptP  *int              `var:"optP,optional"`
	Skip  string            `var:"-"`
	None  string
}

// VariablesFrom writes each tagged field as the variable Bind reads it from, and Bind
// reads back what VariablesFrom wrote.
func TestVariablesFrom(t *testing.T) {
	when := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	p := "pointed"
	in := allKinds{S: "s", B: true, I: 7, I16: 3, I32: 5, U: 9, F: 2.5, T: when, Bytes: []byte{1, 2},
		Addr: netip.MustParseAddr("10.0.0.1"), A: outAddress{City: "Ghent"}, M: map[string]int{"x": 1},
		Raw: json.RawMessage(`{"k":true}`), V: camunda7.XMLVar("<a/>"), Any: int64(4), P: &p, Skip: "no", None: "no"}
	vs, err := tasks.VariablesFrom(in)
	require.NoError(t, err)
	jsonA, _ := camunda7.JSONVar(outAddress{City: "Ghent"})
	jsonM, _ := camunda7.JSONVar(map[string]int{"x": 1})
	raw, _ := camunda7.JSONRawVar([]byte(`{"k":true}`))
	want := camunda7.Variables{
		"s": camunda7.StringVar("s"), "b": camunda7.BoolVar(true), "i": camunda7.LongVar(7), "i16": camunda7.ShortVar(3),
		"i32": camunda7.IntegerVar(5), "u": camunda7.LongVar(9), "f": camunda7.DoubleVar(2.5), "t": camunda7.DateVar(when),
		"bytes": camunda7.BytesVar([]byte{1, 2}), "addr": camunda7.StringVar("10.0.0.1"), "a": jsonA, "m": jsonM, "raw": raw,
		"v": camunda7.XMLVar("<a/>"), "any": camunda7.LongVar(4), "p": camunda7.StringVar("pointed"),
	}
	assert.Equal(t, want, vs, "optional zero fields and untagged fields are left out")

	// A nil pointer writes a null; left out only when optional.
	nulls, err := tasks.VariablesFrom(struct {
		P *string `var:"p"`
		Q *string `var:"q,optional"`
	}{})
	require.NoError(t, err)
	assert.Equal(t, camunda7.Variables{"p": camunda7.NullVar()}, nulls)

	// A pointer to the struct writes the same; a set optional field is written.
	in.Opt = "here"
	vs, err = tasks.VariablesFrom(&in)
	require.NoError(t, err)
	assert.Equal(t, camunda7.StringVar("here"), vs["opt"])

	// The mirror: Bind reads back what VariablesFrom wrote.
	res := taskstest.Run(t, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		var back allKinds
		if err := tk.Bind(&back); err != nil {
			return nil, err
		}
		back.Skip, back.None = "no", "no"
		back.Raw = json.RawMessage(`{"k":true}`) // JSON comes back re-encoded
		back.T = back.T.UTC()                    // a Date comes back in the local zone
		if !assert.Equal(t, in, back) {
			return nil, errors.New("differs")
		}
		return nil, nil
	}, taskstest.Task{Topic: "t", Variables: vs})
	assert.Equal(t, tasks.OutcomeCompleted, res.Outcome)
}

type longText struct{}

func (longText) MarshalText() ([]byte, error) {
	return []byte(strings.Repeat("x", tasks.MaxStringLength+1)), nil
}

// A nil pointer writes a null, for every pointer type: *time.Time and *netip.Addr
// (whose methods are their values') panicked ("value method time.Time.MarshalText called
// using nil *Time pointer"), and a set *time.Time was written as a String, not a Date.
func TestVariablesFromPointers(t *testing.T) {
	when := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	addr := netip.MustParseAddr("10.0.0.1")
	type ptrs struct {
		T *time.Time  `var:"t"`
		A *netip.Addr `var:"a"`
		O *outAddress `var:"o"`
		B *[]byte     `var:"b"`
	}
	for _, tc := range []struct {
		name string
		src  ptrs
		want camunda7.Variables
	}{
		{"nil", ptrs{}, camunda7.Variables{"t": camunda7.NullVar(), "a": camunda7.NullVar(), "o": camunda7.NullVar(), "b": camunda7.NullVar()}},
		{"set", ptrs{T: &when, A: &addr, O: &outAddress{City: "Ghent"}, B: &[]byte{1}},
			camunda7.Variables{"t": camunda7.DateVar(when), "a": camunda7.StringVar("10.0.0.1"), "o": must(camunda7.JSONVar(outAddress{City: "Ghent"})), "b": camunda7.BytesVar([]byte{1})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs, err := tasks.VariablesFrom(tc.src)
			require.NoError(t, err)
			assert.Equal(t, tc.want, vs)
		})
	}
	// Held by an any, a pointer writes what it points to, nil a null.
	vs, err := tasks.VariablesFrom(struct {
		N any `var:"n"`
		T any `var:"t"`
	}{N: (*time.Time)(nil), T: &when})
	require.NoError(t, err)
	assert.Equal(t, camunda7.Variables{"n": camunda7.NullVar(), "t": camunda7.DateVar(when)}, vs)
}

// The longest String the engine stores is written; a longer one is refused (above).
func TestVariablesFromStringAtTheEngineLimit(t *testing.T) {
	s := strings.Repeat("🚀", tasks.MaxStringLength)
	vs, err := tasks.VariablesFrom(struct {
		S string `var:"s"`
	}{S: s})
	require.NoError(t, err)
	assert.Equal(t, camunda7.Variables{"s": camunda7.StringVar(s)}, vs)
}

// An embedded struct with a tag is one Json variable, read and written once: its fields'
// tags are not (they were written twice, as the struct and as its promoted fields).
func TestVariablesFromEmbeddedWithATag(t *testing.T) {
	type Inner struct {
		City string `var:"city"`
	}
	type outer struct {
		Inner `var:"inner"`
	}
	assert.Equal(t, []string{"inner"}, tasks.VariablesOf[outer]())
	vs, err := tasks.VariablesFrom(outer{Inner{City: "Ghent"}})
	require.NoError(t, err)
	assert.Equal(t, camunda7.Variables{"inner": must(camunda7.JSONVar(Inner{City: "Ghent"}))}, vs)

	// Bind reads the one variable, not "city".
	var got outer
	res := taskstest.Run(t, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) { return nil, tk.Bind(&got) },
		taskstest.Task{Topic: "t", Variables: camunda7.Variables{"inner": vs["inner"], "city": camunda7.StringVar("Rome")}})
	require.Equal(t, tasks.OutcomeCompleted, res.Outcome)
	assert.Equal(t, outer{Inner{City: "Ghent"}}, got)
}

func must(v camunda7.Variable, err error) camunda7.Variable {
	if err != nil {
		panic(err)
	}
	return v
}

func TestVariablesFromRefuses(t *testing.T) {
	cases := []struct {
		name string
		src  any
		msg  string
	}{
		{"not a struct", 42, "VariablesFrom needs a struct"},
		{"nil pointer", (*allKinds)(nil), "VariablesFrom needs a struct"},
		{"a duration", struct {
			D time.Duration `var:"d"`
		}{}, "field D: time.Duration: no engine type holds a duration"},
		{"a channel", struct {
			C chan int `var:"c"`
		}{}, "field C: chan int: no variable type"},
		{"an unsigned value past Long", struct {
			U uint64 `var:"u"`
		}{U: math.MaxUint64}, "field U: 18446744073709551615: out of the range of a Long"},
		{"a bad tag", struct {
			X string `var:"x,required"`
		}{}, `write variables from struct { X string "var:\"x,required\"" }: field X: tag var:"x,required": unknown option "required"`},
		{"two fields, one variable", struct {
			A string `var:"x"`
			B string `var:"x"`
		}{}, `field B: variable "x" is field A's too: VariablesFrom writes one field per variable`},
		{"a string longer than the engine stores", struct {
			Note string `var:"note"`
		}{Note: strings.Repeat("ü", tasks.MaxStringLength+1)}, "field Note: String of 4001 characters: the engine stores at most 4000"},
		{"a NUL in a string", struct {
			Note string `var:"note"`
		}{Note: "a\x00b"}, "field Note: String holds a NUL character"},
		{"a NUL in a string held by any", struct {
			Note any `var:"note"`
		}{Note: "a\x00b"}, "field Note: String holds a NUL character"},
		{"a text too long", struct {
			T longText `var:"t"`
		}{}, "field T: String of 4001 characters"},
		{"NaN", struct {
			F float64 `var:"f"`
		}{F: math.NaN()}, "field F: Double NaN: JSON, and so the engine, carries no NaN or infinity"},
		{"+Inf", struct {
			F float32 `var:"f"`
		}{F: float32(math.Inf(1))}, "field F: Double +Inf"},
		{"NaN held by any", struct {
			F any `var:"f"`
		}{F: math.Inf(-1)}, "field F: Double -Inf"},
		{"a duration held by any", struct {
			D any `var:"d"`
		}{D: time.Second}, "field D: time.Duration: no engine type holds a duration"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs, err := tasks.VariablesFrom(tc.src)
			assert.Nil(t, vs)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Equal(t, failure.KindPermanent, failure.Classify(err).Kind, "a handler's bug: an incident, not retries")
		})
	}
}

// tasks.BPMNError writes its variables from a struct as VariablesFrom does; a struct
// that cannot be written is a permanent failure.
func TestBPMNErrorFromStruct(t *testing.T) {
	type declined struct {
		Reason string `var:"reason"`
		Code   int    `var:"code"`
	}
	c := failure.Classify(tasks.BPMNError("DECLINED", "card declined", declined{Reason: "insufficient funds", Code: 51}))
	require.Equal(t, failure.KindBPMNError, c.Kind)
	assert.Equal(t, "DECLINED", c.Code)
	assert.Equal(t, map[string]any{"reason": camunda7.StringVar("insufficient funds"), "code": camunda7.LongVar(51)}, c.Variables)

	assert.Empty(t, failure.Classify(tasks.BPMNError("X", "", nil)).Variables)
	bad := failure.Classify(tasks.BPMNError("X", "", struct {
		D time.Duration `var:"d"`
	}{}))
	assert.Equal(t, failure.KindPermanent, bad.Kind)
}

// tasks.BPMNError takes camunda7.Variables and map[string]any as they are, and a nil
// pointer as none: each made an incident ("VariablesFrom needs a struct") instead of
// throwing the BPMN error. A map value the engine would refuse is named.
func TestBPMNErrorFromVariablesAndMaps(t *testing.T) {
	for _, tc := range []struct {
		name string
		vars any
		want map[string]any
	}{
		{"camunda7.Variables", camunda7.Variables{"reason": camunda7.StringVar("r")}, map[string]any{"reason": camunda7.StringVar("r")}},
		{"map[string]any", map[string]any{"reason": "r", "code": 51}, map[string]any{"reason": camunda7.StringVar("r"), "code": camunda7.LongVar(51)}},
		{"a nil pointer to a struct", (*outAddress)(nil), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := failure.Classify(tasks.BPMNError("DECLINED", "m", tc.vars))
			require.Equal(t, failure.KindBPMNError, c.Kind, "%v", c)
			assert.Equal(t, "DECLINED", c.Code)
			if tc.want == nil {
				assert.Empty(t, c.Variables)
				return
			}
			assert.Equal(t, tc.want, c.Variables)
		})
	}
	err := tasks.BPMNError("DECLINED", "m", map[string]any{"note": "a\x00b"})
	assert.Equal(t, failure.KindPermanent, failure.Classify(err).Kind)
	assert.ErrorContains(t, err, `BPMN error "DECLINED": tasks: write variables: variable "note": String holds a NUL character`)
}

type invoiceOut struct {
	PaymentRef string    `var:"paymentRef"`
	PaidAt     time.Time `var:"paidAt"`
	Note       string    `var:"note,optional"` // left out when empty
}

type declinedOut struct {
	Reason string `var:"declineReason"`
}

// A handler writes its outputs from a struct, the mirror of Bind: VariablesFrom for the
// completion's variables, tasks.BPMNError for a BPMN error's.
func ExampleVariablesFrom() {
	pay := func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
		var in struct {
			AmountCents int64 `var:"amountCents"`
		}
		if err := t.Bind(&in); err != nil {
			return nil, err
		}
		if in.AmountCents > 10_000 {
			return nil, tasks.BPMNError("DECLINED", "over the limit", declinedOut{Reason: "limit"})
		}
		return tasks.VariablesFrom(invoiceOut{PaymentRef: "pay-1", PaidAt: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)})
	}
	reg := tasks.NewRegistry()
	if err := reg.Register("pay", pay, tasks.TopicOptions{Variables: []string{"amountCents"}}); err != nil {
		panic(err)
	}
	for _, amount := range []int64{500, 50_000} {
		res, err := taskstest.Handle(context.Background(), reg, taskstest.Task{Topic: "pay",
			Variables: camunda7.Variables{"amountCents": camunda7.LongVar(amount)}})
		if err != nil {
			panic(err)
		}
		switch res.Outcome {
		case tasks.OutcomeCompleted:
			ref, _ := res.Completed.Variables.String("paymentRef")
			fmt.Println(res.Outcome, ref, len(res.Completed.Variables), "variables")
		case tasks.OutcomeBPMNError:
			reason, _ := res.BPMNError.Variables.String("declineReason")
			fmt.Println(res.Outcome, res.BPMNError.Code, reason)
		}
	}
	// Output:
	// completed pay-1 2 variables
	// bpmn-error DECLINED limit
}
