package tasks

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/testenv"
)

// fakeData serves variable content by scope, as the engine's data endpoints do, and
// records what was asked.
type fakeData struct {
	local, instance map[string][]byte // by variable name
	localErr        error             // returned by LocalVariableData instead, when set
	calls           []string
}

func (f *fakeData) LocalVariableData(_ context.Context, executionID, name string) ([]byte, error) {
	f.calls = append(f.calls, "local "+executionID+" "+name)
	if f.localErr != nil {
		return nil, f.localErr
	}
	if b, ok := f.local[name]; ok {
		return b, nil
	}
	return nil, &camunda7.Error{StatusCode: http.StatusNotFound, Message: "execution variable with name " + name + " does not exist"}
}

func (f *fakeData) VariableData(_ context.Context, processInstanceID, name string) ([]byte, error) {
	f.calls = append(f.calls, "instance "+processInstanceID+" "+name)
	if b, ok := f.instance[name]; ok {
		return b, nil
	}
	return nil, &camunda7.Error{StatusCode: http.StatusNotFound, Message: "process instance variable with name " + name + " does not exist"}
}

// taskWith returns a task whose fetched variables are vars (engine JSON).
func taskWith(t *testing.T, executionID, vars string) *Task {
	t.Helper()
	var vs camunda7.Variables
	require.NoError(t, json.Unmarshal([]byte(vars), &vs))
	return newTask(camunda7.LockedExternalTask{ExternalTask: camunda7.ExternalTask{ID: "task-1", ExecutionID: executionID, ProcessInstanceID: "pi-1"},
		Variables: vs}, "w", 1)
}

const fetchedScan = `{"scan":{"type":"File","value":null,"valueInfo":{"filename":"scan.pdf","mimeType":"application/pdf","encoding":"UTF-8"}}}`

// The content of a fetched File is downloaded where the engine resolves the name for
// the task: the task's execution first, then the process instance; the metadata comes
// from the fetched variable.
func TestFileContentDownloads(t *testing.T) {
	ctx := context.Background()
	t.Run("process variable", func(t *testing.T) {
		src := &fakeData{instance: map[string][]byte{"scan": []byte("%PDF")}}
		f, err := FileContent(ctx, src, taskWith(t, "ex-1", fetchedScan), "scan")
		require.NoError(t, err)
		assert.Equal(t, camunda7.FileValue{Filename: "scan.pdf", MimeType: "application/pdf", Encoding: "UTF-8", Content: []byte("%PDF")}, f)
		assert.Equal(t, []string{"local ex-1 scan", "instance pi-1 scan"}, src.calls)
	})
	t.Run("local variable shadows the process's", func(t *testing.T) {
		src := &fakeData{local: map[string][]byte{"scan": []byte("local")}, instance: map[string][]byte{"scan": []byte("%PDF")}}
		f, err := FileContent(ctx, src, taskWith(t, "ex-1", fetchedScan), "scan")
		require.NoError(t, err)
		assert.Equal(t, []byte("local"), f.Content)
		assert.Equal(t, []string{"local ex-1 scan"}, src.calls)
	})
	t.Run("task on the instance's own execution: one request", func(t *testing.T) {
		src := &fakeData{instance: map[string][]byte{"scan": []byte("%PDF")}}
		f, err := FileContent(ctx, src, taskWith(t, "pi-1", fetchedScan), "scan")
		require.NoError(t, err)
		assert.Equal(t, []byte("%PDF"), f.Content)
		assert.Equal(t, []string{"instance pi-1 scan"}, src.calls)
	})
	t.Run("empty file", func(t *testing.T) {
		src := &fakeData{instance: map[string][]byte{"scan": nil}}
		f, err := FileContent(ctx, src, taskWith(t, "ex-1", fetchedScan), "scan")
		require.NoError(t, err)
		assert.NotNil(t, f.Content, "empty, not absent")
		assert.Empty(t, f.Content)
	})
}

// What needs no download is not downloaded: Bytes arrive whole with the task, and so
// does a File whose value an engine or proxy did send.
func TestFileContentWithoutDownload(t *testing.T) {
	ctx := context.Background()
	src := &fakeData{}
	task := taskWith(t, "ex-1", `{"raw":{"type":"Bytes","value":"AAH/","valueInfo":{}},
		"inline":{"type":"File","value":"aGk=","valueInfo":{"filename":"a.txt"}}}`)
	f, err := FileContent(ctx, src, task, "raw")
	require.NoError(t, err)
	assert.Equal(t, camunda7.FileValue{Content: []byte{0, 1, 0xff}}, f)
	f, err = FileContent(ctx, src, task, "inline")
	require.NoError(t, err)
	assert.Equal(t, camunda7.FileValue{Filename: "a.txt", Content: []byte("hi")}, f)
	assert.Empty(t, src.calls)
}

// Problems with the variable are *camunda7.VariableError, found before asking the
// engine; a content found in no scope matches camunda7.ErrNotFound and names the
// variable; any other error of the local lookup is returned, not papered over by the
// process instance's variable of the same name (which the local one may shadow).
func TestFileContentErrors(t *testing.T) {
	ctx := context.Background()
	task := taskWith(t, "ex-1", `{"scan":{"type":"File","value":null,"valueInfo":{"filename":"scan.pdf"}},
		"str":{"type":"String","value":"secret-value","valueInfo":{}},"gone":{"type":"Null","value":null,"valueInfo":{}},
		"nullBytes":{"type":"Bytes","value":null,"valueInfo":{}}}`)
	for name, want := range map[string]error{"nope": camunda7.ErrVariableMissing, "str": camunda7.ErrVariableType,
		"gone": camunda7.ErrVariableNull, "nullBytes": camunda7.ErrVariableNull} {
		src := &fakeData{}
		_, err := FileContent(ctx, src, task, name)
		require.ErrorIs(t, err, want, name)
		var ve *camunda7.VariableError
		require.ErrorAs(t, err, &ve, name)
		assert.Equal(t, name, ve.Name)
		assert.NotContains(t, err.Error(), "secret-value")
		assert.Empty(t, src.calls, name)
	}

	src := &fakeData{}
	_, err := FileContent(ctx, src, task, "scan")
	require.ErrorIs(t, err, camunda7.ErrNotFound)
	assert.Contains(t, err.Error(), `tasks: content of File variable "scan": `)
	assert.Len(t, src.calls, 2)

	down := &camunda7.TransportError{Op: "get content", Err: errors.New("connection refused")}
	src = &fakeData{localErr: down, instance: map[string][]byte{"scan": []byte("not this one")}}
	_, err = FileContent(ctx, src, task, "scan")
	require.ErrorIs(t, err, camunda7.ErrNotSent)
	assert.Equal(t, []string{"local ex-1 scan"}, src.calls)

	_, err = FileContent(ctx, nil, task, "scan")
	assert.ErrorContains(t, err, "no engine client")
}

// Against the engine: a File fetched with its task (metadata only) is downloaded byte
// for byte, from the process instance or, when the task's execution has a local variable
// of that name, from there; built with FileVar it completes the task.
func TestFileContentAgainstEngine(t *testing.T) {
	t.Parallel()
	c := testenv.Engine(t)
	m := testenv.Deploy(t, c, testenv.ModelOptions{})
	ctx := testenv.Context(t, time.Minute)
	pdf := []byte("%PDF-1.7\x00\xfe\xff ü")
	pi, err := c.StartProcess(ctx, m.Key, admin.StartProcessRequest{Variables: camunda7.Variables{
		"scan": camunda7.FileVar("scan.pdf", "application/pdf", "", pdf),
		"raw":  camunda7.BytesVar([]byte{0, 1, 2}),
	}})
	require.NoError(t, err)
	worker := testenv.Unique("worker")
	got, err := c.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: worker, MaxTasks: 1, Topics: []camunda7.FetchTopic{
		{TopicName: m.Topic, LockDuration: time.Minute, Variables: []string{"scan", "raw"}}}})
	require.NoError(t, err)
	require.Len(t, got, 1)
	task := newTask(got[0], worker, 1)

	f, err := FileContent(ctx, c, task, "scan")
	require.NoError(t, err)
	assert.Equal(t, camunda7.FileValue{Filename: "scan.pdf", MimeType: "application/pdf", Content: pdf}, f)
	b, err := FileContent(ctx, c, task, "raw")
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 1, 2}, b.Content)

	// A local variable of the same name on the task's execution shadows the process's.
	require.NotEqual(t, pi.ID, task.ExecutionID())
	body := fmt.Sprintf(`{"type":"File","value":%q,"valueInfo":{"filename":"local.txt"}}`, base64.StdEncoding.EncodeToString([]byte("local")))
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.BaseURL()+"/execution/"+task.ExecutionID()+"/localVariables/scan", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	f, err = FileContent(ctx, c, task, "scan")
	require.NoError(t, err)
	assert.Equal(t, []byte("local"), f.Content)
	assert.Equal(t, "scan.pdf", f.Filename, "metadata as fetched")

	// Sent on as it came it is refused unsent; rebuilt with its content it completes.
	err = c.Complete(ctx, task.ID(), camunda7.CompleteRequest{WorkerID: worker, Variables: camunda7.Variables{"copy": task.Variables()["scan"]}})
	require.ErrorIs(t, err, camunda7.ErrNoContent)
	require.NoError(t, c.Complete(ctx, task.ID(), camunda7.CompleteRequest{WorkerID: worker,
		Variables: camunda7.Variables{"copy": camunda7.FileVar(f.Filename, f.MimeType, f.Encoding, f.Content)}}))
	data, err := c.VariableData(ctx, pi.ID, "copy")
	require.NoError(t, err)
	assert.Equal(t, []byte("local"), data)
}

// A handler reads an uploaded file that its topic fetches (TopicOptions.Variables:
// []string{"scan"}), and passes it on.
func ExampleFileContent() {
	// In a handler: src is the worker's *camunda7.Client, task the *Task it is given.
	src := &fakeData{instance: map[string][]byte{"scan": []byte("%PDF-1.7 ...")}}
	fetched := camunda7.Variable{Type: camunda7.TypeFile, ValueInfo: camunda7.ValueInfo{Filename: "scan.pdf", MimeType: "application/pdf"}} // no content
	task := newTask(camunda7.LockedExternalTask{ExternalTask: camunda7.ExternalTask{ID: "t", ProcessInstanceID: "pi-1"},
		Variables: camunda7.Variables{"scan": fetched}}, "w", 1)

	f, err := FileContent(context.Background(), src, task, "scan")
	if err != nil {
		fmt.Println(err) // return it from the handler
		return
	}
	fmt.Printf("%s %s %d bytes\n", f.Filename, f.MimeType, len(f.Content))
	out := camunda7.Variables{"archived": camunda7.FileVar(f.Filename, f.MimeType, f.Encoding, f.Content)}
	fmt.Println(out["archived"].Type)
	// Output:
	// scan.pdf application/pdf 12 bytes
	// File
}
