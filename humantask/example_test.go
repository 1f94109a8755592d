package humantask_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
)

// A service in front of the engine's user tasks, behind a reverse proxy at 10.0.0.5
// that authenticates users and names them in X-Forwarded-User (and their groups in
// X-Forwarded-Groups); an approval above 1000 is refused by a business rule. A browser
// loads GET /tasks/{id} (with its ETag) and posts the form to POST
// /tasks/{id}/complete with an Idempotency-Key of its own and If-Match: the ETag.
func Example() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://extworker@127.0.0.1:5432/extworker") // connects on first use
	engine, _ := camunda7.New(camunda7.Config{BaseURL: "http://127.0.0.1:8080/engine-rest"})
	id, _ := humantask.NewProxyHeader(humantask.ProxyHeader{UserHeader: "X-Forwarded-User", GroupsHeader: "X-Forwarded-Groups",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32")}})
	svc, err := humantask.New(humantask.Config{Engine: admin.New(engine), Pool: pool, Identity: id,
		Guards: map[string]humantask.Guard{"approve": func(_ context.Context, t humantask.Task, f humantask.Form) error {
			if amount, _ := t.Variables.Long("amount"); f["approved"] == true && amount > 1000 {
				return errors.New("amounts above 1000 need a second approver")
			}
			return nil
		}}})
	if err != nil {
		panic(err)
	}
	h := svc.Handler() // http.ListenAndServe(addr, h) in the program

	// A completion without its command id and the ETag it was made against is refused
	// before anything is recorded or sent.
	req := httptest.NewRequest(http.MethodPost, "/tasks/42/complete", strings.NewReader(`{"approved":true}`))
	req.RemoteAddr = "10.0.0.5:40000"
	req.Header.Set("X-Forwarded-User", "alice")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Body.String())

	// The proxy's header is believed from the proxy only.
	req = httptest.NewRequest(http.MethodGet, "/tasks", nil)
	req.RemoteAddr = "192.0.2.7:40000"
	req.Header.Set("X-Forwarded-User", "alice")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Body.String())
	// Output:
	// 428 {"error":"Idempotency-Key and If-Match (the task's ETag) are required"}
	// 401 {"error":"no verified identity"}
}
