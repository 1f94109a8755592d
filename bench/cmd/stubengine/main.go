// Command stubengine is a minimal stand-in for the engine's external-task API, for the
// benchmark's ceiling scenario (bench/, scenario 5): it answers fetchAndLock from memory
// with up to maxTasks of -n tasks shaped like the real engine's, accepts complete (204)
// and, so a worker's other calls never fail, extendLock, unlock, failure and bpmnError
// (204), the task query ([]) and the version. It keeps no state per task: the point is
// to cost the worker as little as possible and leave the worker's own cost visible.
//
// It prints to stdout
//
//	LISTEN <host:port>                                  once it serves
//	DONE <first fetch unix ns> <done unix ns> <fetches> <completes>
//
// the second when the -n-th complete arrives (first fetch: the first answer that
// carried tasks). It runs until SIGTERM or SIGINT.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "stubengine:", err)
		os.Exit(1)
	}
}

type stub struct {
	n                  int64
	next               atomic.Int64 // tasks handed out
	completes, fetches atomic.Int64
	firstFetch, doneAt atomic.Int64
	lockUntil, created string
	procDefID, procKey string
	out                *os.File
	maxWait            time.Duration
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	n := flag.Int64("n", 10000, "tasks to hand out")
	topic := flag.String("topic", "bench", "topic name written into the tasks")
	flag.Parse()
	if *n < 1 {
		return fmt.Errorf("-n %d: must be at least 1", *n)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	now := time.Now()
	s := &stub{n: *n, out: os.Stdout, maxWait: 30 * time.Second,
		lockUntil: now.Add(time.Hour).Format("2006-01-02T15:04:05.000-0700"),
		created:   now.Format("2006-01-02T15:04:05.000-0700"),
		procKey:   "stub-process", procDefID: "stub-process:1:00000000-0000-4000-8000-000000000001"}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /engine-rest/external-task/fetchAndLock", func(w http.ResponseWriter, r *http.Request) { s.fetch(w, r, *topic) })
	mux.HandleFunc("POST /engine-rest/external-task/{id}/complete", s.complete)
	for _, action := range []string{"extendLock", "unlock", "failure", "bpmnError"} {
		mux.HandleFunc("POST /engine-rest/external-task/{id}/"+action, noContent)
	}
	mux.HandleFunc("GET /engine-rest/external-task", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "[]")
	})
	mux.HandleFunc("GET /engine-rest/version", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"version":"stub"}`)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(s.out, "LISTEN %s\n", ln.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

func noContent(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.WriteHeader(http.StatusNoContent)
}

type fetchBody struct {
	WorkerID             string `json:"workerId"`
	MaxTasks             int64  `json:"maxTasks"`
	AsyncResponseTimeout *int64 `json:"asyncResponseTimeout"`
}

// claim takes up to k tasks from the pool and returns the first index and the count.
func (s *stub) claim(k int64) (int64, int64) {
	for {
		cur := s.next.Load()
		got := min(k, s.n-cur)
		if got <= 0 {
			return cur, 0
		}
		if s.next.CompareAndSwap(cur, cur+got) {
			return cur, got
		}
	}
}

func (s *stub) fetch(w http.ResponseWriter, r *http.Request, topic string) {
	var b fetchBody
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil || b.MaxTasks < 1 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"type":"InvalidRequestException","message":"bad fetchAndLock body"}`)
		return
	}
	s.fetches.Add(1)
	from, k := s.claim(b.MaxTasks)
	if k == 0 && b.AsyncResponseTimeout != nil && *b.AsyncResponseTimeout > 0 {
		// Long poll on an empty pool: hold the request as the engine does, until its
		// timeout or the client leaves.
		t := time.NewTimer(min(time.Duration(*b.AsyncResponseTimeout)*time.Millisecond, s.maxWait))
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
	}
	if k > 0 {
		s.firstFetch.CompareAndSwap(0, time.Now().UnixNano())
	}
	buf := make([]byte, 0, 64+int(k)*900)
	buf = append(buf, '[')
	for i := from; i < from+k; i++ {
		if i > from {
			buf = append(buf, ',')
		}
		buf = s.appendTask(buf, i, topic, b.WorkerID)
	}
	buf = append(buf, ']')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(buf)))
	_, _ = w.Write(buf)
}

// appendTask writes one locked task with every field the engine sends.
func (s *stub) appendTask(buf []byte, i int64, topic, worker string) []byte {
	id := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
	return fmt.Appendf(buf, `{"activityId":"task","activityInstanceId":"task:%[1]s","errorMessage":null,"errorDetails":null,`+
		`"executionId":"e%[1]s","id":"%[1]s","lockExpirationTime":"%[2]s","createTime":"%[3]s",`+
		`"processDefinitionId":"%[4]s","processDefinitionKey":"%[5]s","processDefinitionVersionTag":null,`+
		`"processInstanceId":"p%[1]s","retries":null,"suspended":false,"workerId":%[6]q,"topicName":%[7]q,`+
		`"tenantId":null,"variables":{},"priority":0,"businessKey":"bk-%[8]d","extensionProperties":{}}`,
		id, s.lockUntil, s.created, s.procDefID, s.procKey, worker, topic, i)
}

func (s *stub) complete(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if !strings.Contains(r.PathValue("id"), "-") {
		http.Error(w, "unknown task", http.StatusNotFound)
		return
	}
	w.WriteHeader(http.StatusNoContent)
	if s.completes.Add(1) == s.n {
		now := time.Now().UnixNano()
		s.doneAt.Store(now)
		fmt.Fprintf(s.out, "DONE %d %d %d %d\n", s.firstFetch.Load(), now, s.fetches.Load(), s.n)
	}
}
