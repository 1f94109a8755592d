// Command rawloop is the floor the benchmark's ceiling scenario (bench/, scenario 5)
// compares extworker with, and the yardstick of its engine-ceiling scenario (scenario 6):
// -concurrency goroutines that each, per task, send one fetchAndLock for one task and one
// complete, with net/http and encoding/json only, and nothing else: no lock extension, no
// logging. Without -tasks (the stub engine) a loop ends when a fetch comes back empty,
// and the first failed request ends the program. With -tasks n (the real engine) the
// loops end when n tasks have been fetched between them: a fetch also comes back empty
// when another loop's fetch locked the same task first, so an empty fetch is sent again
// at once, and so is a fetch or complete the engine failed with a 5xx status, up to
// maxFailures in a row (with many loops the engine fails some: a NullPointerException
// in fetchAndLock racing another loop's complete, a complete failing). It then prints
// "REQUESTS <fetches> <empty fetches> <failed requests>" and waits for SIGTERM or SIGINT
// (so the driver can read its peak RSS from /proc). It prints "FIRST <unix ns>" when it
// holds its first task.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rawloop:", err)
		os.Exit(1)
	}
}

func run() error {
	engine := flag.String("engine", "http://127.0.0.1:8080/engine-rest", "engine REST root")
	topic := flag.String("topic", "", "topic to work (required)")
	concurrency := flag.Int("concurrency", 16, "parallel fetch-complete loops")
	total := flag.Int64("tasks", 0, "stop after fetching this many tasks, sending empty fetches again (0: stop at the first empty fetch)")
	flag.Parse()
	if *topic == "" {
		return fmt.Errorf("-topic is required")
	}
	worker := "rawloop-" + strconv.Itoa(os.Getpid())
	fetchBody, err := json.Marshal(map[string]any{
		"workerId": worker, "maxTasks": 1, "usePriority": false,
		"topics": []map[string]any{{"topicName": *topic, "lockDuration": 30000, "variables": []string{}}},
	})
	if err != nil {
		return err
	}
	completeBody := []byte(`{"workerId":"` + worker + `"}`)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *concurrency * 2}, Timeout: 30 * time.Second}

	var first sync.Once
	var wg sync.WaitGroup
	var fetches, empty, failed, fetched atomic.Int64
	errs := make(chan error, *concurrency)
	for range *concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inARow := 0
			for *total == 0 || fetched.Load() < *total {
				ids, err := fetch(hc, *engine, fetchBody)
				fetches.Add(1)
				if err != nil && *total > 0 && serverError(err) && inARow < maxFailures {
					failed.Add(1)
					inARow++
					continue
				}
				inARow = 0
				if err != nil {
					errs <- err
					return
				}
				if len(ids) == 0 {
					empty.Add(1)
					if *total > 0 {
						continue
					}
					return
				}
				fetched.Add(int64(len(ids)))
				first.Do(func() { fmt.Printf("FIRST %d\n", time.Now().UnixNano()) })
				for _, id := range ids {
					err := complete(hc, *engine, id, completeBody)
					for again := 0; err != nil && *total > 0 && serverError(err) && again < maxFailures; again++ {
						failed.Add(1)
						if err = complete(hc, *engine, id, completeBody); notFound(err) {
							err = nil // the failed attempt did complete it after all
						}
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Printf("REQUESTS %d %d %d\n", fetches.Load(), empty.Load(), failed.Load())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	<-ctx.Done()
	return nil
}

// maxFailures is how many failed requests in a row (fetches, or completes of one task) a
// loop sends again before it gives up.
const maxFailures = 20

// statusError is an answer with an unexpected status.
type statusError struct {
	code int
	msg  string
}

func (e statusError) Error() string { return e.msg }

func serverError(err error) bool {
	var se statusError
	return errors.As(err, &se) && se.code >= 500
}

func notFound(err error) bool {
	var se statusError
	return errors.As(err, &se) && se.code == http.StatusNotFound
}

func fetch(hc *http.Client, engine string, body []byte) ([]string, error) {
	resp, err := hc.Post(engine+"/external-task/fetchAndLock", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, statusError{code: resp.StatusCode, msg: fmt.Sprintf("fetchAndLock: %s: %s", resp.Status, b)}
	}
	var tasks []struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tasks); err != nil {
		return nil, fmt.Errorf("fetchAndLock: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body) // to EOF, so the connection is reused
	ids := make([]string, len(tasks))
	for i, t := range tasks {
		ids[i] = t.ID
	}
	return ids, nil
}

func complete(hc *http.Client, engine, id string, body []byte) error {
	resp, err := hc.Post(engine+"/external-task/"+id+"/complete", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusNoContent {
		return statusError{code: resp.StatusCode, msg: fmt.Sprintf("complete %s: %s", id, resp.Status)}
	}
	return nil
}
