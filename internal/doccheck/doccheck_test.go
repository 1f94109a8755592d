package doccheck_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/doccheck"
	"github.com/extworker/extworker/internal/testenv"
)

// root is the repository, from this package's directory.
const root = "../.."

// examples are every engine call the documentation shows, and the URLs the demo prints
// (its Go strings: examples/invoice). Only calls to the engine are asked: the worker's
// own endpoints (/metrics, /healthz, /readyz, /callbacks/...) appear in the docs as paths
// in prose and tables, not as commands to run, and a live worker's are asked by
// examples/invoice's ops_test.go.
func examples(t *testing.T) []doccheck.Example {
	t.Helper()
	var files []string
	for _, pattern := range []string{"README.md", "docs/*.md", "examples/*/README.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		require.NoError(t, err)
		files = append(files, m...)
	}
	var out []doccheck.Example
	for _, f := range files {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		out = append(out, doccheck.Markdown(rel(f), src)...)
	}
	gos, err := filepath.Glob(filepath.Join(root, "examples/invoice/*.go"))
	require.NoError(t, err)
	for _, f := range gos {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		ex, err := doccheck.GoStrings(rel(f), src)
		require.NoError(t, err)
		out = append(out, ex...)
	}
	return out
}

func rel(f string) string { return strings.TrimPrefix(filepath.ToSlash(f), root+"/") }

// TestDocExamplesAnswerAsShown asks the running engine every call the docs show. Each
// must find its path and method; a GET of a list or a count must answer something (the
// placeholders stand for entities this test creates: a process with an incident), and
// each of its query parameters must be honoured: set to a value that matches nothing, it
// must empty the answer (or be refused, 400). An engine ignores a parameter it does not
// know and answers the unfiltered list: the README once filtered incidents with
// processDefinitionKey, which /incident does not have. An answer shown after the command
// must have the keys it shows.
func TestDocExamplesAnswerAsShown(t *testing.T) {
	exs := examples(t)
	require.NotEmpty(t, exs, "no engine call found in the docs: the extractor is broken")
	h := newHarness(t)
	var problems []string
	for _, ex := range exs {
		t.Logf("asking %s", ex)
		for _, p := range h.check(t, ex) {
			problems = append(problems, ex.String()+"\n    "+p)
		}
	}
	if len(problems) > 0 {
		t.Fatalf("%d documented engine call(s) do not answer as shown:\n%s", len(problems), strings.Join(problems, "\n"))
	}
	t.Logf("%d documented engine calls answer as shown", len(exs))
}

// TestDocCheckCatchesIgnoredParameter feeds the check the line the demo printed before
// the fix: /incident has no processDefinitionKey, so the engine answered every incident.
func TestDocCheckCatchesIgnoredParameter(t *testing.T) {
	h := newHarness(t)
	const demo = `package main
func hint() { fmt.Printf("demo OK: incidents are visible with GET /engine-rest/incident?processDefinitionKey=%s\n", key) }
func fixed() { fmt.Printf("demo OK: incidents are visible with GET /engine-rest/incident?processDefinitionKeyIn=%s\n", key) }`
	exs, err := doccheck.GoStrings("demo.go", []byte(demo))
	require.NoError(t, err)
	require.Len(t, exs, 2)

	problems := h.check(t, exs[0])
	require.Len(t, problems, 1, "the ignored parameter must be reported")
	assert.Contains(t, problems[0], "processDefinitionKey is not honoured")
	assert.Empty(t, h.check(t, exs[1]), "processDefinitionKeyIn filters")
}

// TestDocCheckCatchesWrongPathMethodAndShape: a path the engine does not have, a method
// it does not take on a path, and an answer shown with a key the engine does not send.
func TestDocCheckCatchesWrongPathMethodAndShape(t *testing.T) {
	h := newHarness(t)
	md := "```sh\ncurl http://127.0.0.1:8080/engine-rest/no-such-resource\n```\n\n" +
		"`curl -X DELETE http://127.0.0.1:8080/engine-rest/version`\n\n" +
		"```sh\ncurl http://127.0.0.1:8080/engine-rest/version\n```\n\n```json\n{\"version\": \"7.24.0\", \"edition\": \"x\"}\n```\n"
	exs := doccheck.Markdown("wrong.md", []byte(md))
	require.Len(t, exs, 3)
	assert.Contains(t, strings.Join(h.check(t, exs[0]), "\n"), "404")
	assert.Contains(t, strings.Join(h.check(t, exs[1]), "\n"), "method")
	assert.Contains(t, strings.Join(h.check(t, exs[2]), "\n"), "edition")
}

// TestDocCheckProseCalls: a GET named in the text relative to the REST root is asked
// too. Its placeholder may name no entity of the path's kind, so the engine's "no such
// entity" passes, and only "no such path" fails.
func TestDocCheckProseCalls(t *testing.T) {
	h := newHarness(t)
	md := "The lock watch asks `GET /external-task/<id>`, then `GET /task/{id}/no-such-part`; not run: `POST /task/{id}/complete`.\n"
	exs := doccheck.Markdown("prose.md", []byte(md))
	require.Len(t, exs, 2, "GETs only")
	assert.True(t, exs[0].Prose)
	assert.Equal(t, "GET /external-task/<id>", exs[0].Text)
	assert.Empty(t, h.check(t, exs[0]), "the path exists; the id names no external task")
	assert.Contains(t, strings.Join(h.check(t, exs[1]), "\n"), "no such path")
}

// TestExtract reads the forms the docs use, without services.
func TestExtract(t *testing.T) {
	md := "Try `GET /engine-rest/incident?processDefinitionKeyIn=<key>`; not calls: `/engine-rest/*`, every URL under `/engine-rest/`.\n\n" +
		"```sh\ncurl -s -F deployment-name=trial \\\n  -F data=@docs/examples/console-trial.bpmn \\\n  http://127.0.0.1:8080/engine-rest/deployment/create   # deploys it\n" +
		"curl -H 'Content-Type: application/json' -d '{\"businessKey\": \"b1\"}' http://127.0.0.1:8080/engine-rest/process-definition/key/trial/start\n```\n\n" +
		"```json\n[{\"id\": \"x\", \"incidentType\": \"failedExternalTask\"}]\n```\n"
	exs := doccheck.Markdown("x.md", []byte(md))
	require.Len(t, exs, 3)
	assert.Equal(t, doccheck.Example{File: "x.md", Line: 1, Text: "GET /engine-rest/incident?processDefinitionKeyIn=<key>", Method: "GET",
		URL: "/engine-rest/incident?processDefinitionKeyIn=<key>", Prose: true}, exs[0])
	assert.Equal(t, 4, exs[1].Line)
	assert.Equal(t, "POST", exs[1].Method)
	assert.Equal(t, []string{"deployment-name=trial", "data=@docs/examples/console-trial.bpmn"}, exs[1].Form)
	assert.Equal(t, "http://127.0.0.1:8080/engine-rest/deployment/create", exs[1].URL)
	assert.Nil(t, exs[1].Want, "the next command is not an answer")
	assert.Equal(t, "POST", exs[2].Method)
	assert.Equal(t, `{"businessKey": "b1"}`, exs[2].Data)
	assert.Equal(t, []string{"id", "incidentType"}, exs[2].Want)
}

// harness is the engine and what the placeholders stand for.
type harness struct {
	base string // the engine's REST root
	subs map[string]string
	// values are literal query values that stand for the harness's entities: the keys of
	// processes the docs deploy and run with a worker (which this test does not run), so
	// that a filter on them finds the harness's incident.
	values map[string]string
	hc     *http.Client
	c      *admin.Client
}

// placeholder is what a doc writes where a value goes: <key>, {id}, $KEY, a format verb.
var placeholder = regexp.MustCompile(`<[A-Za-z_-]+>|\{[A-Za-z_]+\}|\$\{?[A-Z_]+\}?|%s|%q|…`)

// newHarness deploys a process, starts an instance and fails its task into an incident,
// so that every list the docs filter has an entry an ignored parameter would show.
func newHarness(t *testing.T) *harness {
	t.Helper()
	c := testenv.Engine(t)
	m := testenv.Deploy(t, c, testenv.ModelOptions{NoMessageWait: true})
	ctx := testenv.Context(t, time.Minute)
	pi, err := c.StartProcess(ctx, m.Key, admin.StartProcessRequest{BusinessKey: testenv.Unique("doc")})
	require.NoError(t, err)
	worker := testenv.Unique("doccheck")
	var task camunda7.LockedExternalTask
	testenv.Eventually(t, 30*time.Second, "the task to fetch", func() (bool, error) {
		got, err := c.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: worker, MaxTasks: 1,
			Topics: []camunda7.FetchTopic{{TopicName: m.Topic, LockDuration: time.Minute}}})
		if len(got) == 1 {
			task = got[0]
		}
		return len(got) == 1, err
	})
	require.NoError(t, c.Failure(ctx, task.ID, camunda7.FailureRequest{WorkerID: worker, ErrorMessage: "doccheck: an incident to find", Retries: 0}))
	key, instance := m.Key, pi.ID
	return &harness{
		base: strings.TrimSuffix(testenv.EngineURL(), "/"),
		hc:   &http.Client{Timeout: 30 * time.Second},
		c:    c,
		subs: map[string]string{
			// the process's key
			"%s": key, "%q": key, "<key>": key, "{key}": key, "$KEY": key,
			// the process instance
			"<id>": instance, "{id}": instance, "<instance-id>": instance, "$INSTANCE": instance,
		},
		values: map[string]string{
			"extworker-demo-invoice": key, // README.md: the demo's, which only `make demo` deploys
			"console-trial":          key, // docs/console.md: its incidents come from a worker
		},
	}
}

// resolve is the example's URL on this engine, its placeholders substituted.
func (h *harness) resolve(raw string, prose bool) (string, error) {
	i := strings.Index(raw, "/engine-rest/")
	if i < 0 {
		return "", fmt.Errorf("not under /engine-rest/")
	}
	p := raw[i+len("/engine-rest"):]
	if path, query, ok := strings.Cut(p, "?"); ok {
		params := strings.Split(query, "&")
		for j, kv := range params {
			if k, v, ok := strings.Cut(kv, "="); ok && h.values[v] != "" {
				params[j] = k + "=" + h.values[v]
			}
		}
		p = path + "?" + strings.Join(params, "&")
	}
	var missing []string
	p = placeholder.ReplaceAllStringFunc(p, func(ph string) string {
		if v, ok := h.subs[ph]; ok {
			return v
		}
		if prose {
			return "no-such-id" // the path is what is checked (see check)
		}
		missing = append(missing, ph)
		return ph
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("no value for placeholder(s) %q: add them to the harness's table", missing)
	}
	return h.base + p, nil
}

type answer struct {
	status int
	body   []byte
}

func (h *harness) do(t *testing.T, ex doccheck.Example, u string) (answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var body io.Reader
	ctype := ""
	switch {
	case len(ex.Form) > 0:
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		for _, f := range ex.Form {
			name, value, _ := strings.Cut(f, "=")
			if file, ok := strings.CutPrefix(value, "@"); ok {
				content, err := os.ReadFile(filepath.Join(root, file)) // the docs' commands run from the repository's root
				if err != nil {
					return answer{}, fmt.Errorf("the form's file: %w", err)
				}
				w, err := mw.CreateFormFile(name, filepath.Base(file))
				require.NoError(t, err)
				_, _ = w.Write(content)
				continue
			}
			require.NoError(t, mw.WriteField(name, value))
		}
		require.NoError(t, mw.Close())
		body, ctype = &buf, mw.FormDataContentType()
	case ex.Data != "":
		body = strings.NewReader(ex.Data)
	}
	req, err := http.NewRequestWithContext(ctx, ex.Method, u, body)
	if err != nil {
		return answer{}, err
	}
	for _, hd := range ex.Header {
		k, v, _ := strings.Cut(hd, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: b}, err
}

// noSuchPath reports whether a 404's body is the engine's "no such path" (JAX-RS's
// NotFoundException), not its "no such entity" on a path that exists.
func noSuchPath(b []byte) bool {
	var e struct{ Type string }
	return json.Unmarshal(b, &e) != nil || e.Type == "NotFoundException"
}

// size is the number of entries a list or count answers; ok is false for any other answer.
func size(b []byte) (n int, ok bool) {
	var list []json.RawMessage
	if json.Unmarshal(b, &list) == nil {
		return len(list), true
	}
	var count struct{ Count *int }
	if json.Unmarshal(b, &count) == nil && count.Count != nil {
		return *count.Count, true
	}
	return 0, false
}

func excerpt(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// check asks the engine ex and returns what does not answer as shown.
func (h *harness) check(t *testing.T, ex doccheck.Example) []string {
	t.Helper()
	if ex.Prose && ex.Method != http.MethodGet {
		return nil // not run: see doccheck.Example.Prose
	}
	u, err := h.resolve(ex.URL, ex.Prose)
	if err != nil {
		return []string{err.Error()}
	}
	a, err := h.do(t, ex, u)
	if err != nil {
		return []string{err.Error()}
	}
	switch {
	case ex.Prose && a.status == http.StatusNotFound && !noSuchPath(a.body):
		return nil // the path is there; the placeholder named no entity of its kind
	case a.status == http.StatusNotFound:
		return []string{fmt.Sprintf("the engine answered 404: no such path (%s)", excerpt(a.body))}
	case a.status == http.StatusMethodNotAllowed:
		return []string{fmt.Sprintf("the engine answered 405: the path does not take method %s", ex.Method)}
	case a.status < 200 || a.status > 299:
		return []string{fmt.Sprintf("the engine answered %d: %s", a.status, excerpt(a.body))}
	}
	if strings.HasSuffix(strings.SplitN(u, "?", 2)[0], "/deployment/create") {
		var d struct{ ID string }
		if json.Unmarshal(a.body, &d) == nil && d.ID != "" {
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := h.c.DeleteDeployment(ctx, d.ID, true); err != nil {
					t.Logf("cleanup: delete deployment %s: %v", d.ID, err)
				}
			})
		}
	}
	var problems []string
	if ex.Want != nil {
		got, ok := doccheck.Shape(a.body)
		if !ok {
			problems = append(problems, "the doc shows a JSON answer; the engine's is not: "+excerpt(a.body))
		}
		for _, k := range ex.Want {
			if ok && !slices.Contains(got, k) {
				problems = append(problems, fmt.Sprintf("the answer shown has key %q; the engine's has %q", k, got))
			}
		}
	}
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	q := parsed.Query()
	if ex.Method != http.MethodGet || len(q) == 0 {
		return problems
	}
	n, isList := size(a.body)
	if !isList {
		return problems // parameters of a single resource: nothing to filter
	}
	if n == 0 {
		return append(problems, "the engine answered an empty list: an ignored parameter would not show; "+
			"make the example match an entity the harness creates (its table of placeholders)")
	}
	for name := range q {
		q2 := url.Values{}
		for k, v := range q {
			q2[k] = v
		}
		nothing := testenv.Unique("no-such-value")
		q2.Set(name, nothing)
		parsed.RawQuery = q2.Encode()
		a2, err := h.do(t, ex, parsed.String())
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if a2.status == http.StatusBadRequest {
			continue // the engine read the parameter, and refused the value
		}
		if n2, _ := size(a2.body); n2 > 0 {
			problems = append(problems, fmt.Sprintf("parameter %s is not honoured: with %s=%s the engine still answers %d entries "+
				"(it ignores a parameter it does not know)", name, name, nothing, n2))
		}
	}
	return problems
}
