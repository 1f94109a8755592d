package camunda7_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/extworker/extworker/camunda7"
)

// fakeEngine serves one canned answer for every request, standing in for
// /engine-rest in these examples.
func fakeEngine(status int, contentType, body string) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
}

func ExampleClient_FetchAndLock() {
	srv := fakeEngine(http.StatusOK, "application/json", `[{
		"id": "7f1c", "topicName": "charge-card", "workerId": "worker-1",
		"processInstanceId": "pi-1", "retries": null, "priority": 0,
		"lockExpirationTime": "2024-05-01T12:00:30.000+0200",
		"variables": {"amount": {"type": "Long", "value": 4200, "valueInfo": {}}}
	}]`)
	defer srv.Close()

	c, err := camunda7.New(camunda7.Config{BaseURL: srv.URL + "/engine-rest"})
	if err != nil {
		fmt.Println(err)
		return
	}
	tasks, err := c.FetchAndLock(context.Background(), camunda7.FetchAndLockRequest{
		WorkerID:             "worker-1",
		MaxTasks:             10,
		AsyncResponseTimeout: 20 * time.Second, // long poll
		Topics: []camunda7.FetchTopic{{
			TopicName:    "charge-card",
			LockDuration: time.Minute,
			Variables:    []string{"amount"}, // nil would fetch none; AllVariables fetches all
		}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, task := range tasks {
		amount, err := task.Variables.Long("amount")
		fmt.Println(task.ID, task.TopicName, amount, err)
		fmt.Println("locked until", task.LockExpirationTime.UTC().Format(time.RFC3339))
		fmt.Println("retries reported:", task.Retries != nil)
	}
	// Output:
	// 7f1c charge-card 4200 <nil>
	// locked until 2024-05-01T10:00:30Z
	// retries reported: false
}

func ExampleClient_Complete_lockLost() {
	srv := fakeEngine(http.StatusBadRequest, "application/json",
		`{"type":"RestException","message":"External Task 7f1c cannot be completed by worker 'worker-1'. It is locked by worker 'worker-2'.","code":0}`)
	defer srv.Close()

	c, err := camunda7.New(camunda7.Config{BaseURL: srv.URL + "/engine-rest"})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = c.Complete(context.Background(), "7f1c", camunda7.CompleteRequest{WorkerID: "worker-1"})

	var ee *camunda7.Error
	if errors.As(err, &ee) {
		fmt.Println(ee.StatusCode, ee.Type, *ee.Code)
	}
	switch {
	case errors.Is(err, camunda7.ErrLockLost):
		fmt.Println("another worker owns the task now: drop the result")
	case errors.Is(err, camunda7.ErrTaskGone):
		fmt.Println("the task no longer exists")
	}
	fmt.Println("nothing took effect:", camunda7.SafeToRetry(err))
	// Output:
	// 400 RestException 0
	// another worker owns the task now: drop the result
	// nothing took effect: true
}

func ExampleSafeToRetry() {
	// A proxy in front of the engine answers with its own error page: the request
	// reached the proxy, so the engine may or may not have completed the task.
	srv := fakeEngine(http.StatusBadGateway, "text/html", "<html><body><h1>502 Bad Gateway</h1></body></html>")
	defer srv.Close()

	c, err := camunda7.New(camunda7.Config{BaseURL: srv.URL + "/engine-rest"})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = c.Complete(context.Background(), "7f1c", camunda7.CompleteRequest{WorkerID: "worker-1"})
	fmt.Println(err)
	fmt.Println("unknown outcome:", errors.Is(err, camunda7.ErrUnknownOutcome))
	fmt.Println("safe to retry blindly:", camunda7.SafeToRetry(err))

	// A request the client refuses is never sent, so it is always safe to retry.
	err = c.Complete(context.Background(), "7f1c", camunda7.CompleteRequest{})
	fmt.Println(err)
	fmt.Println("not sent:", errors.Is(err, camunda7.ErrNotSent), "safe to retry:", camunda7.SafeToRetry(err))
	// Output:
	// complete external task 7f1c: unreadable answer (status 502, content-type "text/html"): not an engine error body; body starts "<html><body><h1>502 Bad Gateway</h1></body></html>"
	// unknown outcome: true
	// safe to retry blindly: false
	// complete external task 7f1c: WorkerID is empty
	// not sent: true safe to retry: true
}

func ExampleTokenSourceFunc() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("engine saw:", r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"version":"7.24.0"}`)
	}))
	defer srv.Close()

	n := 0
	c, err := camunda7.New(camunda7.Config{
		BaseURL: srv.URL + "/engine-rest",
		// Called before every request; a real one would cache and refresh an OAuth2 token.
		TokenSource: camunda7.TokenSourceFunc(func(context.Context) (string, error) {
			n++
			return fmt.Sprintf("token-%d", n), nil
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		v, err := c.Version(context.Background())
		fmt.Println(v, err)
	}
	// Output:
	// engine saw: Bearer token-1
	// 7.24.0 <nil>
	// engine saw: Bearer token-2
	// 7.24.0 <nil>
}

func ExampleConfig_Validate() {
	err := camunda7.Config{BaseURL: "ftp://engine:8080/engine-rest", Timeout: -time.Second, Password: "x"}.Validate()
	fmt.Println(err)
	// Output:
	// camunda7 config: BaseURL "ftp://engine:8080/engine-rest": scheme must be http or https
	// Timeout -1s: must not be negative
	// Password is set but Username is empty
}
