package taskpage_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/humantask/taskpage"
)

// The sample page beside the service's API on one listener, behind a reverse proxy at
// 10.0.0.5 that authenticates users and names them in X-Forwarded-User. A form posted
// from another site's page completes nothing, and nobody the proxy did not name sees a
// task.
func Example() {
	pool, _ := pgxpool.New(context.Background(), "postgres://extworker@127.0.0.1:5432/extworker") // connects on first use
	engine, _ := camunda7.New(camunda7.Config{BaseURL: "http://127.0.0.1:8080/engine-rest"})
	id, _ := humantask.NewProxyHeader(humantask.ProxyHeader{UserHeader: "X-Forwarded-User",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32")}})
	svc, _ := humantask.New(humantask.Config{Engine: admin.New(engine), Pool: pool, Identity: id})
	page, err := taskpage.New(taskpage.Config{Service: svc})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/tasks", svc.Handler())
	mux.Handle("/tasks/", svc.Handler())
	mux.Handle("/ui/", page) // http.ListenAndServe(addr, mux) in the program

	form := url.Values{"command": {"7b1e0c4d9f2a4e6b8c0d1e2f3a4b5c6d"}, "etag": {`"3f2a"`}, "kind.approved": {"boolean"}, "var.approved": {"true"}}
	req := httptest.NewRequest(http.MethodPost, "http://tasks.example/ui/tasks/42", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.RemoteAddr = "10.0.0.5:40000"
	req.Header.Set("X-Forwarded-User", "alice")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	fmt.Println(rec.Code, strings.Contains(rec.Body.String(), "nothing was done"))

	req = httptest.NewRequest(http.MethodGet, "http://tasks.example/ui/", nil)
	req.RemoteAddr = "192.0.2.7:40000"
	req.Header.Set("X-Forwarded-User", "alice")
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get("Content-Security-Policy") != "")
	// Output:
	// 403 true
	// 401 true
}
