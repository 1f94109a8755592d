package callback_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/inbox/callback"
)

// A worker takes the payment provider's callbacks at POST /callbacks/payments: each
// payment.captured reaches the invoice's process instance that waits for it, once.
// The provider signs each callback with its secret (Sign); the server checks it
// against the source's secrets, the old and the new one while the provider rotates.
func Example() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://extworker@127.0.0.1:5432/extworker") // connects on first use
	engine, _ := camunda7.New(camunda7.Config{BaseURL: "http://127.0.0.1:8080/engine-rest"})
	decide := func(m inbox.Message) (inbox.Action, error) {
		var ev struct{ Invoice string }
		if err := json.Unmarshal(m.Body, &ev); err != nil || m.Type != "payment.captured" {
			return inbox.Action{Ignore: "not a captured payment"}, nil
		}
		return inbox.Action{Correlate: &inbox.Correlate{ProcessDefinitionKey: "invoice", MessageName: "PaymentCaptured", BusinessKey: ev.Invoice}}, nil
	}
	h, _ := inbox.NewHandler(pool, admin.New(engine), decide, inbox.Config{Source: "payments"})
	const oldSecret, newSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_c2VjcmV0LWtleS1vZi1hdC1sZWFzdC0yNC1ieXRlcw=="
	srv, err := callback.New(pool, []callback.Source{{Handler: h, Secrets: []string{oldSecret, newSecret}}}, callback.Config{})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/callbacks/{source}", srv)
	// In the worker: go srv.Run(ctx) (held early callbacks), and http.ListenAndServe(addr, mux).

	// The provider's side: sign a callback.
	body := []byte(`{"type":"payment.captured","invoice":"INV-1"}`)
	id, ts := "msg_2xR9", strconv.FormatInt(time.Now().Unix(), 10)
	key, _ := callback.ParseSecret(newSecret)
	sig := callback.Sign(key, id, ts, body)
	fmt.Println("verified:", callback.Verify([]callback.Secret{key}, callback.Headers{ID: id, Timestamp: ts, Signature: sig}, body, time.Now(), callback.DefaultTolerance))

	// A callback signed with a secret the source does not have is refused before the
	// inbox sees it (one signed with oldSecret or newSecret would be recorded and acted on).
	stranger, _ := callback.ParseSecret("whsec_" + "YW5vdGhlci1rZXktb2YtYXQtbGVhc3QtMjQtYnl0ZXM=")
	req := httptest.NewRequest(http.MethodPost, "/callbacks/payments", bytes.NewReader(body))
	req.Header.Set(callback.HeaderID, id)
	req.Header.Set(callback.HeaderTimestamp, ts)
	req.Header.Set(callback.HeaderSignature, callback.Sign(stranger, id, ts, body))
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	fmt.Print(rec.Code, " ", rec.Body.String())
	// Output:
	// verified: <nil>
	// 401 {"error":"signature refused"}
}

// The scheme's own example: the signature of a body with an id and a timestamp.
func ExampleSign() {
	s, _ := callback.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	fmt.Println(callback.Sign(s, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", []byte(`{"test": 2432232314}`)))
	// Output: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
}
