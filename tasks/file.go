package tasks

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/extworker/extworker/camunda7"
)

// VariableDataSource downloads the content of binary variables; *camunda7.Client
// implements it.
type VariableDataSource interface {
	// LocalVariableData returns the content of a File or Bytes variable local to an
	// execution; an error matching camunda7.ErrNotFound when it has none of that name.
	LocalVariableData(ctx context.Context, executionID, name string) ([]byte, error)
	// VariableData returns the content of a process instance's File or Bytes variable.
	VariableData(ctx context.Context, processInstanceID, name string) ([]byte, error)
}

var _ VariableDataSource = (*camunda7.Client)(nil)

// FileContent returns the task's File variable name with its content, downloading the
// content from the engine: fetchAndLock sends a File's metadata (file name, MIME type,
// encoding) but never its data. A Bytes variable is returned as a FileValue with only
// Content set (fetchAndLock sends Bytes whole, so nothing is downloaded).
//
// The variable must have been fetched with the task (TopicOptions.Variables names it, or
// the topic fetches all variables): its metadata and type come from there. The content
// is looked up where the engine resolves the name for the task: first among the
// variables local to the task's execution (input mappings), then among the process
// instance's. A variable of an intermediate scope (an embedded subprocess) is found in
// neither: the error then matches camunda7.ErrNotFound. The content is read whole, at
// most camunda7.Config.MaxResponseBytes.
//
// Errors about the variable itself are *camunda7.VariableError (missing, not a File or
// Bytes, null); the value never appears in an error. To send the file on, build it with
// camunda7.FileVar(f.Filename, f.MimeType, f.Encoding, f.Content): sending the fetched
// variable as it came fails with camunda7.ErrNoContent.
func FileContent(ctx context.Context, src VariableDataSource, t *Task, name string) (camunda7.FileValue, error) {
	vs := t.Variables()
	if v, ok := vs[name]; ok && strings.EqualFold(v.Type, camunda7.TypeBytes) {
		b, err := vs.Bytes(name)
		if err != nil {
			return camunda7.FileValue{}, err
		}
		return camunda7.FileValue{Content: b}, nil
	}
	fv, err := vs.File(name)
	if err != nil {
		return camunda7.FileValue{}, err
	}
	if fv.Content != nil {
		return fv, nil // a value came with it (an engine or proxy that sends it)
	}
	if src == nil {
		return camunda7.FileValue{}, fmt.Errorf("tasks: content of File variable %q: no engine client to download it from", name)
	}
	data, err := downloadContent(ctx, src, t, name)
	if err != nil {
		return camunda7.FileValue{}, fmt.Errorf("tasks: content of File variable %q: %w", name, err)
	}
	if data == nil {
		data = []byte{}
	}
	fv.Content = data
	return fv, nil
}

// downloadContent asks the task's execution first (a local variable shadows the
// process instance's of the same name), then the process instance.
func downloadContent(ctx context.Context, src VariableDataSource, t *Task, name string) ([]byte, error) {
	if ex := t.ExecutionID(); ex != "" && ex != t.ProcessInstanceID() {
		data, err := src.LocalVariableData(ctx, ex, name)
		if !errors.Is(err, camunda7.ErrNotFound) {
			return data, err
		}
	}
	return src.VariableData(ctx, t.ProcessInstanceID(), name)
}
