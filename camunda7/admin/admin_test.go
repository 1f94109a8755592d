package admin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// recorder is an engine that answers 200 {} and records each request's method and
// escaped path.
type recorder struct {
	mu   sync.Mutex
	reqs []string
}

func newClient(t *testing.T) (*admin.Client, *recorder) {
	t.Helper()
	rec := &recorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, r.Method+" "+r.URL.EscapedPath())
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	c, err := camunda7.New(camunda7.Config{BaseURL: srv.URL + "/engine-rest"})
	require.NoError(t, err)
	return admin.New(c), rec
}

// Ids go into paths escaped, whatever they contain.
func TestPathEscaping(t *testing.T) {
	const id = "a/b c?d#e%f{g}"
	esc := url.PathEscape(id)
	for _, tc := range []struct {
		name string
		call func(context.Context, *admin.Client) error
		want string
	}{
		{"start process", func(ctx context.Context, c *admin.Client) error {
			_, err := c.StartProcess(ctx, id, admin.StartProcessRequest{})
			return err
		}, "POST /engine-rest/process-definition/key/" + esc + "/start"},
		{"delete process instance", func(ctx context.Context, c *admin.Client) error { return c.DeleteProcessInstance(ctx, id) },
			"DELETE /engine-rest/process-instance/" + esc},
		{"historic process instance", func(ctx context.Context, c *admin.Client) error {
			_, err := c.HistoricProcessInstance(ctx, id)
			return err
		}, "GET /engine-rest/history/process-instance/" + esc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, rec := newClient(t)
			require.NoError(t, tc.call(t.Context(), c))
			assert.Equal(t, []string{tc.want}, rec.reqs)
		})
	}
}

// Calls refused before anything is sent say so, with what they are.
func TestInvalidArguments(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(context.Context, *admin.Client) error
		op   string
	}{
		{"start process empty key", func(ctx context.Context, c *admin.Client) error {
			_, err := c.StartProcess(ctx, "", admin.StartProcessRequest{})
			return err
		}, "start process "},
		{"correlate empty message name", func(ctx context.Context, c *admin.Client) error {
			return c.CorrelateMessage(ctx, admin.MessageCorrelation{})
		}, "correlate message "},
		{"deploy no resources", func(ctx context.Context, c *admin.Client) error {
			_, err := c.Deploy(ctx, admin.Deployment{Name: "d"})
			return err
		}, "create deployment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, rec := newClient(t)
			err := tc.call(t.Context(), c)
			require.Error(t, err)
			assert.ErrorIs(t, err, camunda7.ErrInvalidArgument)
			assert.ErrorIs(t, err, camunda7.ErrNotSent)
			assert.Contains(t, err.Error(), tc.op)
			assert.Empty(t, rec.reqs, "nothing sent")
		})
	}
}
