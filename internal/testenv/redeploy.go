package testenv

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// RedeployProxy forwards to the real engine, but answers the first requests whose path
// ends with a suffix with an HTML 404 page, as a servlet container or a proxy does while
// the engine's web app is redeployed: a 404 that is not the engine's answer about any
// task.
type RedeployProxy struct {
	suffix, page string
	left         atomic.Int64
	Injected     atomic.Int64 // 404 pages served
	Passed       atomic.Int64 // requests with the suffix forwarded to the engine after them
}

// NewRedeployProxy starts a proxy that answers the first n requests ending with suffix
// with page, and returns it with the REST root to give a client.
func NewRedeployProxy(t testing.TB, suffix, page string, n int64) (*RedeployProxy, string) {
	t.Helper()
	p := &RedeployProxy{suffix: suffix, page: page}
	p.left.Store(n)
	u, err := url.Parse(EngineURL())
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Director = func(r *http.Request) { r.URL.Scheme, r.URL.Host = u.Scheme, u.Host }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, p.suffix) {
			if p.left.Add(-1) >= 0 {
				p.Injected.Add(1)
				w.Header().Set("Content-Type", "text/html;charset=utf-8")
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprint(w, p.page)
				return
			}
			defer p.Passed.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return p, srv.URL + u.Path
}
