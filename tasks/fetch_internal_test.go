package tasks

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
)

// Every fetch setting camunda7.FetchTopic has (its variables, its filters, its lock
// duration) is a field of TopicOptions of the same name and type, and reaches the
// fetchAndLock request unchanged: the test fails as soon as the client gains a filter
// that a topic cannot set, or fetchTopic forgets to pass one on.
func TestTopicOptionsPassEveryFetchFilter(t *testing.T) {
	ft := reflect.TypeFor[camunda7.FetchTopic]()
	ot := reflect.TypeFor[TopicOptions]()
	var opts TopicOptions
	ov := reflect.ValueOf(&opts).Elem()
	for f := range ft.Fields() {
		if f.Name == "TopicName" { // the registered name, not an option
			continue
		}
		of, ok := ot.FieldByName(f.Name)
		if !assert.True(t, ok, "camunda7.FetchTopic.%s has no TopicOptions field: add it, and pass it on in fetchTopic", f.Name) {
			continue
		}
		if !assert.Equal(t, f.Type, of.Type, "TopicOptions.%s", f.Name) {
			continue
		}
		ov.FieldByIndex(of.Index).Set(nonZero(t, f.Name, f.Type))
	}
	got := reflect.ValueOf(opts.fetchTopic("topic"))
	assert.Equal(t, "topic", got.FieldByName("TopicName").String())
	for f := range ft.Fields() {
		if f.Name == "TopicName" {
			continue
		}
		if _, ok := ot.FieldByName(f.Name); ok {
			assert.Equal(t, ov.FieldByName(f.Name).Interface(), got.FieldByName(f.Name).Interface(),
				"TopicOptions.%s does not reach camunda7.FetchTopic.%s (fetchTopic)", f.Name, f.Name)
		}
	}

	// And a registered topic asks for exactly that.
	reg := NewRegistry()
	require.NoError(t, reg.Register("topic", nop, TopicOptions{DeserializeValues: true, Variables: []string{"a"}, TenantIDIn: []string{"x"}}))
	w := testWorkerFor(t, reg)
	req, ok := w.plan(0)
	require.True(t, ok)
	require.Len(t, req.Topics, 1)
	assert.True(t, req.Topics[0].DeserializeValues)
	assert.Equal(t, []string{"a"}, req.Topics[0].Variables)
	assert.Equal(t, []string{"x"}, req.Topics[0].TenantIDIn)
	assert.Equal(t, DefaultLockDuration, req.Topics[0].LockDuration, "the default lock duration")
}

func testWorkerFor(t *testing.T, reg *Registry) *Worker {
	t.Helper()
	c, err := camunda7.New(camunda7.Config{})
	require.NoError(t, err)
	w, err := New(c, reg, Config{WorkerID: "w"})
	require.NoError(t, err)
	return w
}

// nonZero returns a value of type t that is not its zero value.
func nonZero(t *testing.T, name string, typ reflect.Type) reflect.Value {
	v := reflect.New(typ).Elem()
	switch {
	case typ == reflect.TypeFor[time.Duration]():
		v.SetInt(int64(42 * time.Second))
	case typ.Kind() == reflect.String:
		v.SetString(name + "-value")
	case typ.Kind() == reflect.Bool:
		v.SetBool(true)
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.String:
		v = reflect.ValueOf([]string{name + "-1", name + "-2"})
	case typ.Kind() == reflect.Map && typ.Key().Kind() == reflect.String:
		v = reflect.MakeMap(typ)
		v.SetMapIndex(reflect.ValueOf("k"), reflect.New(typ.Elem()).Elem())
	default:
		t.Fatalf("FetchTopic.%s: no test value for type %v; extend nonZero", name, typ)
	}
	return v
}
