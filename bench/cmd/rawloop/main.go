// Command rawloop is the floor the benchmark's ceiling scenario (bench/, scenario 5)
// compares extworker with: -concurrency goroutines that each, per task, send one
// fetchAndLock for one task and one complete, with net/http and encoding/json only, and
// nothing else: no lock extension, no retries, no logging. It exits when a fetch comes
// back empty, then waits for SIGTERM or SIGINT (so the driver can read its peak RSS
// from /proc), and prints "FIRST <unix ns>" when it holds its first task.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
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
	errs := make(chan error, *concurrency)
	for range *concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ids, err := fetch(hc, *engine, fetchBody)
				if err != nil {
					errs <- err
					return
				}
				if len(ids) == 0 {
					return
				}
				first.Do(func() { fmt.Printf("FIRST %d\n", time.Now().UnixNano()) })
				for _, id := range ids {
					if err := complete(hc, *engine, id, completeBody); err != nil {
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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	<-ctx.Done()
	return nil
}

func fetch(hc *http.Client, engine string, body []byte) ([]string, error) {
	resp, err := hc.Post(engine+"/external-task/fetchAndLock", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("fetchAndLock: %s: %s", resp.Status, b)
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
		return fmt.Errorf("complete %s: %s", id, resp.Status)
	}
	return nil
}
