package camunda7_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
)

type order struct {
	ID     string   `json:"id"`
	Amount int64    `json:"amount"`
	Tags   []string `json:"tags"`
	Note   string   `json:"note"`
}

// allTypes is one variable of every type the engine speaks, with values that break
// naive codecs: a Long above 2^53, a Date with a +05:30 offset, unicode text.
func allTypes(t *testing.T) (camunda7.Variables, time.Time, order) {
	t.Helper()
	ist := time.FixedZone("IST", 5*3600+30*60)
	when := time.Date(2026, 3, 14, 9, 26, 53, 589_000_000, ist)
	o := order{ID: "INV-2026-001", Amount: 9007199254740993, Tags: []string{"ü", "東京"}, Note: "line1\nline2 \"quoted\" 🚀"}
	js, err := camunda7.JSONVar(o)
	require.NoError(t, err)
	obj, err := camunda7.ObjectVar("java.util.LinkedHashMap", o)
	require.NoError(t, err)
	return camunda7.Variables{
		"str":     camunda7.StringVar("Grüße, 東京 🚀 \"q\" \\ <tag>"),
		"empty":   camunda7.StringVar(""),
		"yes":     camunda7.BoolVar(true),
		"short":   camunda7.ShortVar(-32768),
		"int":     camunda7.IntegerVar(2147483647),
		"long":    camunda7.LongVar(9007199254740993),
		"minLong": camunda7.LongVar(-9223372036854775808),
		"double":  camunda7.DoubleVar(3.141592653589793),
		"date":    camunda7.DateVar(when),
		"null":    camunda7.NullVar(),
		"bytes":   camunda7.BytesVar([]byte{0, 1, 2, 0xfe, 0xff}),
		"json":    js,
		"object":  obj,
		"file":    camunda7.FileVar("invoice.txt", "text/plain", "UTF-8", []byte("total: 42 €")),
	}, when, o
}

func checkAllTypes(t *testing.T, vs camunda7.Variables, when time.Time, o order, where string) {
	t.Helper()
	s, err := vs.String("str")
	require.NoError(t, err, where)
	assert.Equal(t, "Grüße, 東京 🚀 \"q\" \\ <tag>", s, where)
	s, err = vs.String("empty")
	require.NoError(t, err, where)
	assert.Equal(t, "", s, where)
	b, err := vs.Bool("yes")
	require.NoError(t, err, where)
	assert.True(t, b, where)
	n, err := vs.Long("short")
	require.NoError(t, err, where)
	assert.EqualValues(t, -32768, n, where)
	i, err := vs.Integer("int")
	require.NoError(t, err, where)
	assert.EqualValues(t, 2147483647, i, where)
	n, err = vs.Long("long")
	require.NoError(t, err, where)
	assert.EqualValues(t, int64(9007199254740993), n, where)
	n, err = vs.Long("minLong")
	require.NoError(t, err, where)
	assert.EqualValues(t, int64(-9223372036854775808), n, where)
	f, err := vs.Double("double")
	require.NoError(t, err, where)
	assert.Equal(t, 3.141592653589793, f, where)
	d, err := vs.Date("date")
	require.NoError(t, err, where)
	assert.True(t, when.Equal(d), "%s: date %v, want the instant %v", where, d, when)
	v, err := vs.Value("null")
	require.NoError(t, err, where)
	assert.Nil(t, v, where)
	raw, err := vs.Bytes("bytes")
	require.NoError(t, err, where)
	assert.Equal(t, []byte{0, 1, 2, 0xfe, 0xff}, raw, where)
	var got order
	require.NoError(t, vs.JSON("json", &got), where)
	assert.Equal(t, o, got, where)
	got = order{}
	require.NoError(t, vs.JSON("object", &got), where)
	assert.Equal(t, o, got, where)
	fv, err := vs.File("file")
	require.NoError(t, err, where)
	assert.Equal(t, "invoice.txt", fv.Filename, where)
	assert.Equal(t, "text/plain", fv.MimeType, where)
}

// Every type round-trips: start -> fetchAndLock, and complete -> the instance's variables.
func TestConformanceVariablesRoundTrip(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	vars, when, o := allTypes(t)
	pi := e.start("", vars)

	topic := e.topic(time.Minute)
	topic.AllVariables = true
	tasks := e.fetch(e.worker, 1, topic)
	require.Len(t, tasks, 1)
	fetched := tasks[0].Variables
	assert.Len(t, fetched, len(vars))
	checkAllTypes(t, fetched, when, o, "fetchAndLock")
	for name, v := range fetched {
		assert.Equal(t, vars[name].Type, v.Type, "type of %s", name)
	}
	assert.Equal(t, "application/json", fetched["object"].ValueInfo.SerializationDataFormat)
	assert.Equal(t, "java.util.LinkedHashMap", fetched["object"].ValueInfo.ObjectTypeName)

	// Send them back renamed through complete, and read them from the waiting instance.
	out := camunda7.Variables{}
	for name, v := range vars {
		out["out_"+name] = v
	}
	require.NoError(t, e.c.Complete(e.ctx, tasks[0].ID, camunda7.CompleteRequest{WorkerID: e.worker, Variables: out}))
	got, err := e.c.ProcessInstanceVariables(e.ctx, pi.ID)
	require.NoError(t, err)
	back := camunda7.Variables{}
	for name := range vars {
		back[name] = got["out_"+name]
	}
	checkAllTypes(t, back, when, o, "after complete")

	// History holds them too, with their types.
	hv, err := e.c.HistoricVariableInstances(e.ctx, url.Values{"processInstanceId": {pi.ID}, "variableName": {"out_long"}})
	require.NoError(t, err)
	require.Len(t, hv, 1)
	n, err := camunda7.Variables{"v": hv[0].Variable()}.Long("v")
	require.NoError(t, err)
	assert.EqualValues(t, int64(9007199254740993), n)
}

// The engine rejects dates in any format but its own; ours is accepted with any offset.
func TestConformanceDateOffsets(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	vars := camunda7.Variables{}
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+30*60), time.FixedZone("", -(9*3600 + 30*60)), time.FixedZone("", 14*3600)}
	instant := time.Date(2026, 12, 31, 23, 59, 59, 999_000_000, time.UTC)
	for i, z := range zones {
		vars[string(rune('a'+i))] = camunda7.DateVar(instant.In(z))
	}
	pi := e.start("", vars)
	got, err := e.c.ProcessInstanceVariables(e.ctx, pi.ID)
	require.NoError(t, err)
	for name := range vars {
		d, err := got.Date(name)
		require.NoError(t, err)
		assert.True(t, instant.Equal(d), "%s: %v", name, d)
	}
}

// A String variable is stored in a varchar(4000) column of the engine's database
// (PostgreSQL here): complete with a 4000-character String is accepted, with 4000
// two-byte or 4000 four-byte characters too (the limit counts characters, not bytes nor
// UTF-16 units); 4001 characters, or a NUL character anywhere, are refused with 500
// ProcessEnginePersistenceException, and the task stays locked for the worker, its lock
// untouched. A Json variable of 4001 characters is accepted (stored as a byte array).
// tasks/taskstest answers the same, and tasks.VariablesFrom refuses such a String.
func TestConformanceCompleteWithStringTheDatabaseRefuses(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	const persistence = "An exception occurred in the persistence layer. Please check the server logs for a detailed message and the entire exception stack trace."
	long, err := camunda7.JSONVar(strings.Repeat("x", 4001))
	require.NoError(t, err)
	for _, c := range []struct {
		name    string
		v       camunda7.Variable
		refused bool
	}{
		{"4000 ascii", camunda7.StringVar(strings.Repeat("x", 4000)), false},
		{"4000 two-byte", camunda7.StringVar(strings.Repeat("ü", 4000)), false},
		{"4000 four-byte", camunda7.StringVar(strings.Repeat("🚀", 4000)), false},
		{"4001 ascii", camunda7.StringVar(strings.Repeat("x", 4001)), true},
		{"4001 two-byte", camunda7.StringVar(strings.Repeat("ü", 4001)), true},
		{"nul", camunda7.StringVar("a\x00b"), true},
		{"json 4001", long, false},
	} {
		pi, task := e.startAndLock(time.Minute)
		err := e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker, Variables: camunda7.Variables{"s": c.v}})
		if !c.refused {
			require.NoError(t, err, c.name)
			vs, err := e.c.ProcessInstanceVariables(e.ctx, pi.ID)
			require.NoError(t, err, c.name)
			want, err := camunda7.Variables{"s": c.v}.Value("s")
			require.NoError(t, err, c.name)
			got, err := vs.Value("s")
			require.NoError(t, err, c.name)
			assert.Equal(t, want, got, c.name)
			continue
		}
		engineError(t, err, 500, "ProcessEnginePersistenceException", q(persistence))
		assert.NotErrorIs(t, err, camunda7.ErrLockLost, c.name)
		got, err := e.c.ExternalTask(e.ctx, task.ID)
		require.NoError(t, err, c.name)
		assert.Equal(t, e.worker, got.WorkerID, "%s: still locked for the worker", c.name)
		assert.True(t, got.LockExpirationTime.Equal(task.LockExpirationTime.Time), "%s: lock untouched", c.name)
		assert.Nil(t, got.Retries, c.name)
	}
}
