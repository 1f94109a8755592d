package camunda7_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
)

// fetchedFile is a File variable as fetchAndLock returns it: metadata, null value.
func fetchedFile(t *testing.T) camunda7.Variable {
	t.Helper()
	var v camunda7.Variable
	require.NoError(t, json.Unmarshal([]byte(`{"type":"File","value":null,"valueInfo":{"filename":"scan.pdf","mimeType":"application/pdf"}}`), &v))
	return v
}

// countingEngine answers every request with 204 and counts them.
func countingEngine(t *testing.T) (*camunda7.Client, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	c, err := camunda7.New(camunda7.Config{BaseURL: srv.URL + "/engine-rest"})
	require.NoError(t, err)
	return c, &n
}

// A File variable without content (a fetched one sent back as it came) is refused by
// Complete, Failure and BPMNError before anything is sent, with an error naming the
// variable; Files with content (even empty) and Bytes with a null value are sent.
func TestFileWithoutContentRefusedBeforeSending(t *testing.T) {
	ctx := context.Background()
	c, sent := countingEngine(t)
	noContent := camunda7.Variables{"ok": camunda7.StringVar("x"), "scan": fetchedFile(t)}
	calls := map[string]func() error{
		"complete variables": func() error {
			return c.Complete(ctx, "t1", camunda7.CompleteRequest{WorkerID: "w", Variables: noContent})
		},
		"complete local variables": func() error {
			return c.Complete(ctx, "t1", camunda7.CompleteRequest{WorkerID: "w", LocalVariables: noContent})
		},
		"failure": func() error {
			return c.Failure(ctx, "t1", camunda7.FailureRequest{WorkerID: "w", Retries: 1, Variables: noContent})
		},
		"failure local": func() error {
			return c.Failure(ctx, "t1", camunda7.FailureRequest{WorkerID: "w", Retries: 1, LocalVariables: noContent})
		},
		"bpmn error": func() error {
			return c.BPMNError(ctx, "t1", camunda7.BPMNErrorRequest{WorkerID: "w", ErrorCode: "E", Variables: noContent})
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			err := call()
			require.ErrorIs(t, err, camunda7.ErrNoContent)
			assert.ErrorIs(t, err, camunda7.ErrInvalidArgument)
			assert.ErrorIs(t, err, camunda7.ErrNotSent)
			var ve *camunda7.VariableError
			require.ErrorAs(t, err, &ve)
			assert.Equal(t, "scan", ve.Name)
			assert.Equal(t, camunda7.TypeFile, ve.Type)
			assert.Contains(t, err.Error(), `variable "scan" (type File): File variable has no content`)
		})
	}
	assert.Zero(t, sent.Load(), "nothing reached the engine")

	for name, v := range map[string]camunda7.Variable{
		"file with content":     camunda7.FileVar("a.txt", "text/plain", "UTF-8", []byte("hi")),
		"file with empty data":  camunda7.FileVar("empty.bin", "", "", nil),
		"bytes with null value": {Type: camunda7.TypeBytes},
	} {
		require.NoError(t, c.Complete(ctx, "t1", camunda7.CompleteRequest{WorkerID: "w", Variables: camunda7.Variables{"v": v}}), name)
	}
	assert.EqualValues(t, 3, sent.Load())

	// Only sending is refused: the fetched set still marshals as it came (for logs, dumps).
	_, err := json.Marshal(noContent)
	assert.NoError(t, err)
}

// VariableData and LocalVariableData GET the engine's data endpoints, escape the path,
// return the body whatever its content type, and refuse empty identifiers unsent.
func TestVariableDataRequests(t *testing.T) {
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.Method+" "+r.URL.EscapedPath())
		w.Header().Set("Content-Type", "application/pdf")
		_, _ = w.Write([]byte{0, 1, 0xff})
	}))
	defer srv.Close()
	c, err := camunda7.New(camunda7.Config{BaseURL: srv.URL + "/engine-rest"})
	require.NoError(t, err)
	ctx := context.Background()

	b, err := c.VariableData(ctx, "pi 1", "scan/1")
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 1, 0xff}, b)
	b, err = c.LocalVariableData(ctx, "ex-1", "scan")
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 1, 0xff}, b)
	assert.Equal(t, []string{
		"GET /engine-rest/process-instance/pi%201/variables/scan%2F1/data",
		"GET /engine-rest/execution/ex-1/localVariables/scan/data",
	}, paths)

	for _, call := range []func() ([]byte, error){
		func() ([]byte, error) { return c.VariableData(ctx, "", "scan") },
		func() ([]byte, error) { return c.VariableData(ctx, "pi", "") },
		func() ([]byte, error) { return c.LocalVariableData(ctx, "", "scan") },
	} {
		_, err := call()
		assert.ErrorIs(t, err, camunda7.ErrInvalidArgument)
	}
	assert.Len(t, paths, 2)
}

// A content larger than MaxResponseBytes is refused, not truncated.
func TestVariableDataTooLarge(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(make([]byte, 2048))
	}))
	defer srv.Close()
	c, err := camunda7.New(camunda7.Config{BaseURL: srv.URL, MaxResponseBytes: 1024})
	require.NoError(t, err)
	_, err = c.VariableData(context.Background(), "pi", "big")
	assert.ErrorIs(t, err, camunda7.ErrResponseTooLarge)
}

// Against the engine: fetchAndLock sends a File without its content (and Bytes with
// theirs); the data endpoints return both, byte for byte, for process variables and for
// variables local to the task's execution; a missing variable, an unknown instance or
// execution are ErrNotFound, a variable that is not binary ErrBadRequest.
func TestConformanceVariableData(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	pdf := []byte("%PDF-1.7\x00\x01\xfe\xff binary ü")
	pi := e.start("", camunda7.Variables{
		"scan":  camunda7.FileVar("scan.pdf", "application/pdf", "", pdf),
		"note":  camunda7.FileVar("note.txt", "text/plain", "UTF-8", []byte("total: 42 €")),
		"raw":   camunda7.BytesVar([]byte{0, 1, 2, 0xfe, 0xff}),
		"empty": camunda7.FileVar("empty.bin", "", "", nil),
		"str":   camunda7.StringVar("not binary"),
	})
	topic := e.topic(time.Minute)
	topic.AllVariables = true
	tasks := e.fetch(e.worker, 1, topic)
	require.Len(t, tasks, 1)
	task := tasks[0]

	fv, err := task.Variables.File("scan")
	require.NoError(t, err)
	assert.Equal(t, "scan.pdf", fv.Filename)
	assert.Nil(t, fv.Content, "the engine does not send a File's content")
	raw, err := task.Variables.Bytes("raw")
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 1, 2, 0xfe, 0xff}, raw, "Bytes arrive with their value")

	for name, want := range map[string][]byte{"scan": pdf, "note": []byte("total: 42 €"), "raw": {0, 1, 2, 0xfe, 0xff}, "empty": {}} {
		got, err := e.c.VariableData(e.ctx, pi.ID, name)
		require.NoError(t, err, name)
		assert.Equal(t, want, append([]byte{}, got...), name)
	}

	_, err = e.c.VariableData(e.ctx, pi.ID, "nope")
	engineError(t, err, http.StatusNotFound, "InvalidRequestException", q("process instance variable with name nope does not exist"))
	assert.ErrorIs(t, err, camunda7.ErrNotFound)
	_, err = e.c.VariableData(e.ctx, pi.ID, "str")
	engineError(t, err, http.StatusBadRequest, "InvalidRequestException", `Value of variable with id \S+ is not a binary value\.`)
	assert.ErrorIs(t, err, camunda7.ErrBadRequest)
	_, err = e.c.VariableData(e.ctx, "no-such-instance", "scan")
	engineError(t, err, http.StatusInternalServerError, "RestException",
		q("Cannot get process instance variable scan: execution no-such-instance doesn't exist: execution is null"))
	assert.ErrorIs(t, err, camunda7.ErrNotFound, "the engine's 500 for an unknown instance")

	// The task's own execution holds no process variable locally...
	require.NotEqual(t, pi.ID, task.ExecutionID)
	_, err = e.c.LocalVariableData(e.ctx, task.ExecutionID, "scan")
	engineError(t, err, http.StatusNotFound, "InvalidRequestException", q("execution variable with name scan does not exist"))
	// ...until one is set there.
	local := []byte("local \x00 data")
	status, body := rawDo(t, http.MethodPut, "/execution/"+task.ExecutionID+"/localVariables/scan",
		fmt.Sprintf(`{"type":"File","value":%q,"valueInfo":{"filename":"local.bin"}}`, base64.StdEncoding.EncodeToString(local)))
	require.Equal(t, http.StatusNoContent, status, "%v", body)
	got, err := e.c.LocalVariableData(e.ctx, task.ExecutionID, "scan")
	require.NoError(t, err)
	assert.Equal(t, local, got)
	got, err = e.c.VariableData(e.ctx, pi.ID, "scan")
	require.NoError(t, err)
	assert.Equal(t, pdf, got, "the process variable is untouched")
	_, err = e.c.LocalVariableData(e.ctx, "no-such-execution", "scan")
	engineError(t, err, http.StatusInternalServerError, "RestException",
		q("Cannot get execution variable scan: execution no-such-execution doesn't exist: execution is null"))
	assert.ErrorIs(t, err, camunda7.ErrNotFound)
}

// Against the engine: sending a fetched File back as it came is the engine's 500 (pinned
// with a raw request, which changes nothing); the client refuses it before sending, and
// the same File with its downloaded content completes the task.
func TestConformanceFileWithoutContent(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	pi := e.start("", camunda7.Variables{"scan": camunda7.FileVar("scan.pdf", "application/pdf", "", []byte("%PDF"))})
	topic := e.topic(time.Minute)
	topic.Variables = []string{"scan"}
	tasks := e.fetch(e.worker, 1, topic)
	require.Len(t, tasks, 1)
	task := tasks[0]
	fetched := task.Variables["scan"]

	b, err := json.Marshal(camunda7.Variables{"copy": fetched})
	require.NoError(t, err)
	status, body := rawPost(t, "/external-task/"+task.ID+"/complete", fmt.Sprintf(`{"workerId":%q,"variables":%s}`, e.worker, b))
	assert.Equal(t, http.StatusInternalServerError, status)
	assert.Equal(t, "IllegalArgumentException", body["type"])
	assert.Equal(t, "Provided value is not of File, InputStream or byte[] type.", body["message"])

	err = e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker, Variables: camunda7.Variables{"copy": fetched}})
	require.ErrorIs(t, err, camunda7.ErrNoContent)
	assert.True(t, camunda7.SafeToRetry(err))

	data, err := e.c.VariableData(e.ctx, pi.ID, "scan")
	require.NoError(t, err)
	fv, err := task.Variables.File("scan")
	require.NoError(t, err)
	full := camunda7.FileVar(fv.Filename, fv.MimeType, fv.Encoding, data)
	require.NoError(t, e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker, Variables: camunda7.Variables{"copy": full}}),
		"the task was still locked: neither refusal changed it")
	got, err := e.c.VariableData(e.ctx, pi.ID, "copy")
	require.NoError(t, err)
	assert.Equal(t, []byte("%PDF"), got)
	vars, err := e.c.ProcessInstanceVariables(e.ctx, pi.ID)
	require.NoError(t, err)
	copyMeta, err := vars.File("copy")
	require.NoError(t, err)
	assert.Equal(t, "scan.pdf", copyMeta.Filename)
	assert.Equal(t, "application/pdf", copyMeta.MimeType)
}
