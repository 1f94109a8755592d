package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/tasks"
)

// The demo: an invoice process with two external tasks. Collecting the payment declines
// large amounts with a BPMN error (the model's boundary path), fails once transiently for
// some invoices (retried by policy), and raises an incident for an invoice without an
// amount; sending the receipt always works.
const (
	demoProcessKey    = "extworker-demo-invoice"
	demoTopicCollect  = "extworker-demo.collect-payment"
	demoTopicReceipt  = "extworker-demo.send-receipt"
	demoDeclineLimit  = 10_000_00 // cents
	demoDeploymentSrc = "extworker demo"
)

const demoBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
                  id="extworker-demo" targetNamespace="http://extworker.dev/demo">
  <bpmn:error id="Declined" name="Payment declined" errorCode="PAYMENT_DECLINED"/>
  <bpmn:process id="` + demoProcessKey + `" name="extworker demo: invoice" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="invoiceReceived"/>
    <bpmn:sequenceFlow id="f1" sourceRef="invoiceReceived" targetRef="collectPayment"/>
    <bpmn:serviceTask id="collectPayment" name="Collect payment" camunda:type="external" camunda:topic="` + demoTopicCollect + `"/>
    <bpmn:sequenceFlow id="f2" sourceRef="collectPayment" targetRef="sendReceipt"/>
    <bpmn:serviceTask id="sendReceipt" name="Send receipt" camunda:type="external" camunda:topic="` + demoTopicReceipt + `"/>
    <bpmn:sequenceFlow id="f3" sourceRef="sendReceipt" targetRef="invoicePaid"/>
    <bpmn:endEvent id="invoicePaid"/>
    <bpmn:boundaryEvent id="paymentDeclined" attachedToRef="collectPayment">
      <bpmn:errorEventDefinition errorRef="Declined"/>
    </bpmn:boundaryEvent>
    <bpmn:sequenceFlow id="f4" sourceRef="paymentDeclined" targetRef="invoiceDeclined"/>
    <bpmn:endEvent id="invoiceDeclined"/>
  </bpmn:process>
</bpmn:definitions>`

// demoHandlers registers the demo topics.
func demoHandlers(lock time.Duration) (*tasks.Registry, error) {
	reg := tasks.NewRegistry()
	var failedOnce sync.Map // invoice id -> true: the simulated transient outage hits each once
	retry := failure.RetryPolicy{MaxAttempts: 3, InitialDelay: 200 * time.Millisecond, MaxDelay: 2 * time.Second}
	err := reg.Register(demoTopicCollect, func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
		invoice, err := t.Variables().String("invoiceId")
		if err != nil {
			return nil, failure.Permanent(err)
		}
		amount, err := t.Variables().Long("amountCents")
		if err != nil {
			return nil, failure.Permanent(fmt.Errorf("invoice %s: %w", invoice, err))
		}
		if err := wait(ctx, 20*time.Millisecond+rand.N(40*time.Millisecond)); err != nil {
			return nil, err
		}
		if amount > demoDeclineLimit {
			return nil, failure.BPMNError("PAYMENT_DECLINED", "amount above the card limit", map[string]any{"declineReason": "limit"})
		}
		if strings.HasSuffix(invoice, "7") {
			if _, seen := failedOnce.LoadOrStore(invoice, true); !seen {
				return nil, fmt.Errorf("payment provider: 503 service unavailable for invoice %s", invoice)
			}
		}
		return camunda7.Variables{"paymentRef": camunda7.StringVar("pay_" + invoice)}, nil
	}, tasks.TopicOptions{LockDuration: lock, Variables: []string{"invoiceId", "amountCents"}, MaxConcurrency: 8, Retry: retry})
	if err != nil {
		return nil, err
	}
	err = reg.Register(demoTopicReceipt, func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
		ref, err := t.Variables().String("paymentRef")
		if err != nil {
			return nil, failure.Permanent(err)
		}
		if err := wait(ctx, 10*time.Millisecond); err != nil {
			return nil, err
		}
		return camunda7.Variables{"receiptId": camunda7.StringVar("rcpt_" + strings.TrimPrefix(ref, "pay_"))}, nil
	}, tasks.TopicOptions{LockDuration: lock, Variables: []string{"paymentRef"}, Retry: retry})
	return reg, err
}

func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// deployDemo deploys the demo process unless the same version is there already.
func deployDemo(ctx context.Context, c *camunda7.Client) error {
	_, err := c.Deploy(ctx, camunda7.Deployment{Name: demoProcessKey, Source: demoDeploymentSrc, EnableDuplicateFiltering: true,
		Resources: []camunda7.Resource{{Name: demoProcessKey + ".bpmn", Content: []byte(demoBPMN)}}})
	return err
}

// runWorker runs the demo topics until ctx ends.
func runWorker(ctx context.Context, cfg config, logger *slog.Logger) error {
	c, err := newClient(cfg, logger)
	if err != nil {
		return err
	}
	reg, err := demoHandlers(cfg.LockDuration)
	if err != nil {
		return err
	}
	w, err := tasks.New(c, reg, cfg.workerConfig(logger))
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// runDemo deploys the demo, starts n invoices, works them off and prints what happened.
func runDemo(ctx context.Context, cfg config, logger *slog.Logger, out io.Writer, n int) error {
	if n < 1 {
		return errors.New("demo: -instances must be at least 1")
	}
	c, err := newClient(cfg, logger)
	if err != nil {
		return err
	}
	v, err := c.Version(ctx)
	if err != nil {
		return fmt.Errorf("engine at %s: %w (run `make up`)", redactedURL(cfg.EngineURL), err)
	}
	if err := deployDemo(ctx, c); err != nil {
		return err
	}
	run := fmt.Sprintf("demo-%d", time.Now().Unix())
	var ids []string
	expect := map[string]int{}
	for i := 0; i < n; i++ {
		invoice := fmt.Sprintf("INV-%s-%03d", run, i)
		vars := camunda7.Variables{"invoiceId": camunda7.StringVar(invoice)}
		switch {
		case i%10 == 9:
			expect["incident"]++ // no amount: permanent failure
		case i%10 == 4:
			vars["amountCents"] = camunda7.LongVar(25_000_00)
			expect["declined"]++
		default:
			vars["amountCents"] = camunda7.LongVar(int64(1000 + 137*i))
			expect["paid"]++
		}
		pi, err := c.StartProcess(ctx, demoProcessKey, camunda7.StartProcessRequest{BusinessKey: invoice, Variables: vars})
		if err != nil {
			return err
		}
		ids = append(ids, pi.ID)
	}
	fmt.Fprintf(out, "engine %s at %s: started %d invoices (%s)\n", v, redactedURL(cfg.EngineURL), n, run)

	reg, err := demoHandlers(cfg.LockDuration)
	if err != nil {
		return err
	}
	wcfg := cfg.workerConfig(logger)
	wcfg.AsyncResponseTimeout = min(wcfg.AsyncResponseTimeout, 2*time.Second) // retries wait out their timeout; see README
	w, err := tasks.New(c, reg, wcfg)
	if err != nil {
		return err
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(wctx) }()

	got, err := waitDemo(ctx, c, ids, 3*time.Minute)
	took := time.Since(start)
	stop()
	if rerr := <-done; rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	st := w.Stats()
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "outcome\texpected\tgot\n")
	for _, k := range []string{"paid", "declined", "incident"} {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", k, expect[k], got[k])
	}
	tw.Flush()
	fmt.Fprintf(out, "worker %s: %d tasks fetched, %d completed, %d BPMN errors, %d retried failures, %d incidents, max %d in flight, %.1fs\n",
		w.WorkerID(), st.Fetched.Load(), st.Completed.Load(), st.BPMNErrors.Load(), st.Failures.Load(), st.Incidents.Load(), st.MaxInFlight.Load(), took.Seconds())
	for _, k := range []string{"paid", "declined", "incident"} {
		if got[k] != expect[k] {
			return fmt.Errorf("demo: %d %s, expected %d", got[k], k, expect[k])
		}
	}
	fmt.Fprintln(out, "demo OK: incidents are visible in Cockpit or with GET /engine-rest/incident?processDefinitionKey="+demoProcessKey)
	return nil
}

// waitDemo waits until every instance has ended or holds an incident, and counts how.
// Each instance is looked at until its fate is known, then left alone.
func waitDemo(ctx context.Context, c *camunda7.Client, ids []string, limit time.Duration) (map[string]int, error) {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	got := map[string]int{}
	pending := ids
	for {
		var still []string
		for _, id := range pending {
			fate, err := demoFate(ctx, c, id)
			if err != nil {
				return got, err
			}
			if fate == "" {
				still = append(still, id)
			}
			got[fate]++
		}
		delete(got, "")
		pending = still
		if len(pending) == 0 {
			return got, nil
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return got, fmt.Errorf("demo: %d instances not finished after %v (so far %v)", len(pending), limit, got)
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
}

// demoFate is "paid", "declined", "incident", or "" while the instance is still going.
func demoFate(ctx context.Context, c *camunda7.Client, id string) (string, error) {
	h, err := c.HistoricProcessInstance(ctx, id)
	if err != nil {
		return "", err
	}
	if h.State == "COMPLETED" {
		acts, err := c.HistoricActivityInstances(ctx, url.Values{"processInstanceId": {id}, "activityId": {"invoiceDeclined"}})
		if err != nil || len(acts) == 0 {
			return "paid", err
		}
		return "declined", nil
	}
	inc, err := c.Incidents(ctx, url.Values{"processInstanceId": {id}})
	if err != nil || len(inc) == 0 {
		return "", err
	}
	return "incident", nil
}
