package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// engine wraps the real engine for the driver: deployments, instances, counts.
type engine struct {
	c    *admin.Client
	base string
	hc   *http.Client

	mu          sync.Mutex
	deployments []string
}

func newEngine(base string) (*engine, error) {
	c, err := camunda7.New(camunda7.Config{BaseURL: base})
	if err != nil {
		return nil, err
	}
	return &engine{c: admin.New(c), base: c.BaseURL(), hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}}, nil
}

// model is one trial's process: its own key and topic, so no trial ever sees another's
// tasks or an abandoned long poll of an earlier worker.
type model struct {
	Key, Topic string
}

// BPMN is the benchmark's process: start, one external task, end.
func BPMN(key, topic string) string {
	return fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
                  id="bench" targetNamespace="http://extworker.dev/bench">
  <bpmn:process id=%q isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="task"/>
    <bpmn:serviceTask id="task" name="Work" camunda:type="external" camunda:topic=%q/>
    <bpmn:sequenceFlow id="f2" sourceRef="task" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>`, key, topic)
}

func (e *engine) deploy(ctx context.Context, name string) (model, error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	suffix := hex.EncodeToString(b)
	m := model{Key: "bench-" + name + "-" + suffix, Topic: "bench." + name + "." + suffix}
	res, err := e.c.Deploy(ctx, admin.Deployment{Name: m.Key, Source: "extworker bench",
		Resources: []admin.Resource{{Name: m.Key + ".bpmn", Content: []byte(BPMN(m.Key, m.Topic))}}})
	if err != nil {
		return m, err
	}
	e.mu.Lock()
	e.deployments = append(e.deployments, res.ID)
	e.mu.Unlock()
	return m, nil
}

// start starts n instances with business keys prefix-0 … prefix-(n-1), four at a time.
func (e *engine) start(ctx context.Context, key string, n int, prefix string) error {
	const parallel = 4
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				_, err := e.c.StartProcess(ctx, key, admin.StartProcessRequest{BusinessKey: fmt.Sprintf("%s-%d", prefix, i)})
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed || ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// open returns the number of external tasks of the topic not yet completed.
func (e *engine) open(ctx context.Context, topic string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+"/external-task/count?topicName="+url.QueryEscape(topic), nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := e.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Count int `json:"count"`
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("count external tasks of %s: %s: %s", topic, resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("count external tasks of %s: %w", topic, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return out.Count, nil
}

// drained polls the open task count every 20 ms until it is zero and returns when the
// query that saw zero was sent. It fails if the worker exits or the timeout passes. A
// count that fails is asked again (an engine busy with thousands of completes can be
// slower than the query's timeout), unless ten in a row fail.
func (e *engine) drained(ctx context.Context, topic string, p *proc, timeout time.Duration) (time.Time, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last, failed := -1, 0
	for {
		sent := time.Now()
		n, err := e.open(ctx, topic)
		switch {
		case err != nil && ctx.Err() == nil && failed < 9:
			failed++
			n = last
		case err != nil:
			return time.Time{}, err
		default:
			failed = 0
		}
		if n == 0 {
			return sent, nil
		}
		last = n
		select {
		case <-tick.C:
		case <-p.exited:
			return time.Time{}, fmt.Errorf("%s exited with %d tasks left: %v (log: %s)", p.name, last, p.exitErr(), p.logPath)
		case <-deadline.C:
			return time.Time{}, fmt.Errorf("%d tasks of %s still open after %v (log: %s)", last, topic, timeout, p.logPath)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// cleanup deletes every deployment of the run with its instances and history.
func (e *engine) cleanup(ctx context.Context, progress io.Writer) {
	e.mu.Lock()
	ids := e.deployments
	e.deployments = nil
	e.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	began := time.Now()
	for _, id := range ids {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := e.c.DeleteDeployment(dctx, id, true)
		cancel()
		if err != nil {
			fmt.Fprintf(progress, "bench: cleanup: delete deployment %s: %v\n", id, err)
		}
	}
	e.c.CloseIdleConnections()
	e.hc.CloseIdleConnections()
	fmt.Fprintf(progress, "bench: deleted %d deployments with their history in %v\n", len(ids), time.Since(began).Round(100*time.Millisecond))
}
