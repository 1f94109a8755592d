package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
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
	demoScope         = "payment.collect" // the intents of collect-payment
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

// demoEnv is what the demo handlers charge through and count with.
type demoEnv struct {
	ledger *idempotency.Ledger
	pay    *fakeprovider.Client
	// searchOn and searchLag: the provider's business search, used past its idempotency
	// window (EXTWORKER_PROVIDER_SEARCH, EXTWORKER_PROVIDER_SEARCH_LAG).
	searchOn  bool
	searchLag time.Duration
	// timeout bounds each provider call (EXTWORKER_PROVIDER_TIMEOUT, the HTTP client's).
	timeout time.Duration
	// eventsNS is the outbox namespace paid invoices announce themselves in
	// (events.go); empty without a broker.
	eventsNS string
	// counted from the ledger's outcomes
	replayed, reconciled atomic.Int64
}

// search returns the business search for one invoice's charge, or nil when the provider
// has none (the ledger then sends unknown charges past the window to an operator).
func (env *demoEnv) search(invoice string) func(context.Context, idempotency.Query) (idempotency.Reconciliation, error) {
	if !env.searchOn {
		return nil
	}
	return func(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
		found, err := env.pay.Search(ctx, invoice)
		switch {
		case err != nil:
			return idempotency.StillUnknown(err.Error()), nil
		case len(found) == 0:
			return idempotency.Absent(), nil // trusted by the ledger only past the lag
		case len(found) > 1:
			return idempotency.Hold(fmt.Sprintf("the provider has %d charges for this invoice", len(found))), nil
		}
		return idempotency.Found(chargeResult(found[0].ID)), nil
	}
}

// chargeResult is the ledger's result of a charge the provider made: its reference, also
// the task's paymentRef.
func chargeResult(id string) idempotency.Result {
	return idempotency.Result{ProviderRef: id, Values: map[string]any{"paymentRef": id}}
}

// demoHandlers registers the demo topics. Collecting a payment runs through the effect
// ledger: the provider is charged at most once per invoice, whatever the engine
// redelivers, and an unknown outcome is reconciled with the provider before anything is
// sent again. The lock duration is the registrar's default (App.Handle's
// EXTWORKER_LOCK_DURATION).
func demoHandlers(env *demoEnv, register func(string, tasks.Handler, tasks.TopicOptions) error) error {
	retry := failure.RetryPolicy{MaxAttempts: 5, InitialDelay: 200 * time.Millisecond, MaxDelay: 2 * time.Second}
	err := register(demoTopicCollect, func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
		invoice, err := t.Variables().String("invoiceId")
		if err != nil {
			return nil, failure.Permanent(err)
		}
		amount, err := t.Variables().Long("amountCents")
		if err != nil {
			return nil, failure.Permanent(fmt.Errorf("invoice %s: %w", invoice, err))
		}
		eff := idempotency.Effect{
			Dispatch: func(ctx context.Context, key string) (idempotency.Result, error) {
				ch, err := env.pay.Charge(ctx, key, invoice, amount)
				var decline *fakeprovider.DeclineError
				switch {
				case err == nil:
					return chargeResult(ch.ID), nil
				case errors.As(err, &decline):
					return idempotency.Result{}, idempotency.Rejected("PAYMENT_DECLINED", decline.Message)
				case errors.Is(err, fakeprovider.ErrNotSent):
					return idempotency.Result{}, idempotency.NotSent(err)
				case errors.Is(err, fakeprovider.ErrKeyMismatch):
					// The provider holds this key for a different request: never retried.
					return idempotency.Result{}, failure.Permanent(err)
				}
				return idempotency.Result{}, err // an unknown outcome
			},
			Reconcile: func(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
				ch, err := env.pay.Lookup(ctx, q.ProviderKey)
				var decline *fakeprovider.DeclineError
				var stored *fakeprovider.StoredFailureError
				switch {
				case err == nil:
					return idempotency.Found(chargeResult(ch.ID)), nil
				case errors.Is(err, fakeprovider.ErrNotFound):
					return idempotency.Absent(), nil
				case errors.As(err, &decline):
					return idempotency.ReconciledRejected("PAYMENT_DECLINED", decline.Message), nil
				case errors.As(err, &stored):
					// Stripe stores a 500 under the key: nothing was charged, and the key
					// only ever replays the failure. A new charge needs a new key: an operator.
					return idempotency.Hold(fmt.Sprintf("the provider stored a %d under this key: no charge was made, and a same-key retry only replays the failure", stored.Status)), nil
				}
				return idempotency.StillUnknown(err.Error()), nil
			},
			Search:    env.search(invoice),
			SearchLag: env.searchLag,
			Timeout:   env.timeout, // the ledger refuses a lease that cannot leave it whole
		}
		if env.eventsNS != "" {
			// invoice.paid, in the transaction that records the charge: published if and
			// only if the charge is (the outbox).
			eff.Local = func(ctx context.Context, tx pgx.Tx, res idempotency.Result) error {
				return addPaidEvent(ctx, tx, env.eventsNS, invoice, amount, res.ProviderRef)
			}
		}
		out, err := env.ledger.Do(ctx, idempotency.Intent{
			Scope:   demoScope,
			Key:     "invoice:" + invoice + ":v1",
			Request: map[string]any{"invoice": invoice, "amountCents": amount},
			Amount:  amount, // for the two-person rule's threshold
			Task:    idempotency.TaskRef{Actor: t.WorkerID(), TaskID: t.ID(), ProcessInstanceID: t.ProcessInstanceID(), BusinessKey: t.BusinessKey()},
		}, eff)
		if err != nil {
			return nil, err // already a classified outcome
		}
		if out.Replayed {
			env.replayed.Add(1)
		}
		if out.State == idempotency.StateReconciled && !out.Replayed {
			env.reconciled.Add(1)
		}
		return camunda7.Variables{"paymentRef": camunda7.StringVar(out.ProviderRef)}, nil
	}, tasks.TopicOptions{Variables: []string{"invoiceId", "amountCents"}, MaxConcurrency: 8, Retry: retry})
	if err != nil {
		return err
	}
	err = register(demoTopicReceipt, func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
		ref, err := t.Variables().String("paymentRef")
		if err != nil {
			return nil, failure.Permanent(err)
		}
		if err := wait(ctx, 10*time.Millisecond); err != nil {
			return nil, err
		}
		return camunda7.Variables{"receiptId": camunda7.StringVar("rcpt_" + strings.TrimPrefix(ref, "ch_"))}, nil
	}, tasks.TopicOptions{Variables: []string{"paymentRef"}, Retry: retry})
	return err
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
func deployDemo(ctx context.Context, c *admin.Client) error {
	_, err := c.Deploy(ctx, admin.Deployment{Name: demoProcessKey, Source: demoDeploymentSrc, EnableDuplicateFiltering: true,
		Resources: []admin.Resource{{Name: demoProcessKey + ".bpmn", Content: []byte(demoBPMN)},
			{Name: demoShippingKey + ".bpmn", Content: []byte(demoShippingBPMN)}}})
	return err
}

// runWorker runs the demo topics until ctx ends, as any worker program does through the
// entry point (package extworker): metrics, health and readiness on EXTWORKER_HTTP_ADDR,
// the ledger's hooks and pruning, orphaned intents flagged.
func runWorker(ctx context.Context, app *extworker.App, pc providerConfig, ec eventsConfig) error {
	env, _, closeEnv, err := newDemoEnv(pc, app.Ledger())
	if err != nil {
		return err
	}
	defer closeEnv()
	if ec.on() {
		// Paid invoices announce themselves, and start their shipping, through the
		// outbox and the inbox (events.go), on the broker EXTWORKER_DEMO_EVENTS names.
		env.eventsNS = app.Ledger().Namespace()
		if err := consumeShipping(app, ec); err != nil {
			return err
		}
	}
	if err := demoHandlers(env, app.Handle); err != nil {
		return err
	}
	return app.Run(ctx)
}

// runDemo deploys the demo, starts n invoices, works them off with a worker of its own
// and prints what happened: a progress line while it runs (progress.go), then the
// summary. The ledger is migrated already (`invoice demo` does it).
func runDemo(ctx context.Context, app *extworker.App, pc providerConfig, ec eventsConfig, stdout io.Writer, n int) error {
	c := admin.New(app.Client())
	engine := redactURL(app.Client().BaseURL())
	v, err := c.Version(ctx)
	if err != nil {
		return fmt.Errorf("engine at %s: %w (run `make demo-up`)", engine, err)
	}
	if err := deployDemo(ctx, c); err != nil {
		return err
	}
	ledger := app.Ledger()
	env, pay, closeEnv, err := newDemoEnv(pc, ledger)
	if err != nil {
		return err
	}
	defer closeEnv()
	var events *demoEvents
	if ec.on() {
		if events, err = startDemoEvents(ctx, app, ec); err != nil {
			return err
		}
		defer events.stop()
		env.eventsNS = ledger.Namespace()
	}

	plan := planDemo(fmt.Sprintf("demo-%d", time.Now().Unix()), n)
	// The summary is written once the progress line is gone, whether the demo succeeds or not.
	var published, consumed func() int64
	if events != nil {
		published, consumed = events.published.Load, events.stats.Received.Load
	}
	prog := newProgress(stdout, len(plan.invoices)+plan.duplicates, published, consumed)
	var out bytes.Buffer
	defer func() {
		prog.stop()
		_, _ = stdout.Write(out.Bytes())
	}()
	ids, err := startDemo(ctx, c, plan, pay, &prog.started)
	if err != nil {
		return err
	}
	fmt.Fprintf(&out, "engine %s at %s: started %d instances for %d invoices, %d of them submitted twice (%s)\n",
		v, engine, len(ids), n, plan.duplicates, plan.run)
	if err := runDemoWorker(ctx, app, env, c, ids, plan, &out, prog.fates); err != nil {
		return err
	}
	rows, err := checkDemoLedger(ctx, env, plan, &out)
	if err != nil {
		return err
	}
	if events != nil {
		if err := checkDemoEvents(ctx, events, c, rows, plan, &out); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(&out, "events: none (EXTWORKER_AMQP_URL is not set and EXTWORKER_DEMO_EVENTS is not kafka: no broker for invoice.paid and the shipping process)")
	}
	if pay != nil {
		if err := checkDemoProvider(pay, plan, &out); err != nil {
			return err
		}
	}
	fmt.Fprintf(&out, "demo OK: incidents are visible in Cockpit%s or with GET /engine-rest/incident?processDefinitionKeyIn=%s\n",
		cockpitHint(app.Client().BaseURL()), demoProcessKey)
	return nil
}

// demoInvoice is one invoice the demo starts: its variables, whether it is submitted
// twice, and the fault the fake provider is scripted with for it (none when 0).
type demoInvoice struct {
	id     string
	vars   camunda7.Variables
	twice  bool
	script fakeprovider.Fault
}

// demoPlan is a demo run decided before anything is sent: which invoices, what each
// should end as, and the counts the checks compare against.
type demoPlan struct {
	run        string
	invoices   []demoInvoice
	amounts    map[string]int64 // the paid invoices' amounts
	expect     map[string]int   // paid, declined, incident: instances expected to end so
	paid       int              // invoices expected to be charged once each
	duplicates int              // invoices submitted twice
}

// planDemo decides a run of n invoices: every tenth (9, 19, ...) has no amount (a
// permanent failure: an incident), every tenth from 4 is declined by the provider, the
// rest are paid; of those, the provider loses the answer of every tenth from 7
// (reconciled) and drops every tenth from 3 unseen (sent again, same key); every 25th
// with an amount is submitted twice (one intent, one charge).
func planDemo(run string, n int) demoPlan {
	p := demoPlan{run: run, amounts: map[string]int64{}, expect: map[string]int{}}
	for i := 0; i < n; i++ {
		inv := demoInvoice{id: fmt.Sprintf("INV-%s-%03d", run, i)}
		inv.vars = camunda7.Variables{"invoiceId": camunda7.StringVar(inv.id)}
		switch {
		case i%10 == 9:
			p.expect["incident"]++
		case i%10 == 4:
			inv.vars["amountCents"] = camunda7.LongVar(25_000_00)
			p.expect["declined"]++
		default:
			amount := int64(1000 + 137*i)
			inv.vars["amountCents"] = camunda7.LongVar(amount)
			p.amounts[inv.id] = amount
			p.expect["paid"]++
			p.paid++
			switch i % 10 {
			case 7:
				inv.script = fakeprovider.LoseAnswer
			case 3:
				inv.script = fakeprovider.DropBeforeAccept
			}
		}
		if i%25 == 0 && inv.vars.Has("amountCents") {
			inv.twice = true
			p.expect["paid"]++
			p.duplicates++
		}
		p.invoices = append(p.invoices, inv)
	}
	return p
}

// startDemo scripts the fake provider (when the demo runs its own) and starts the
// plan's instances, demoStarters at a time, returning their ids and counting them in
// started.
func startDemo(ctx context.Context, c *admin.Client, plan demoPlan, pay *fakeprovider.Server, started *atomic.Int64) ([]string, error) {
	var starts []demoInvoice // one per instance: an invoice submitted twice is there twice
	for _, inv := range plan.invoices {
		if pay != nil && inv.script != 0 {
			pay.Script(inv.id, inv.script)
		}
		starts = append(starts, inv)
		if inv.twice {
			starts = append(starts, inv)
		}
	}
	ids := make([]string, len(starts))
	errs := make([]error, len(starts))
	next := make(chan int)
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range demoStarters {
		wg.Go(func() {
			for i := range next {
				inv := starts[i]
				pi, err := c.StartProcess(ctx, demoProcessKey, admin.StartProcessRequest{BusinessKey: inv.id, Variables: inv.vars})
				if err != nil {
					errs[i] = err
					failed.Store(true)
					continue
				}
				ids[i] = pi.ID
				started.Add(1)
			}
		})
	}
	for i := range starts {
		if ctx.Err() != nil || failed.Load() {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return ids, ctx.Err()
}

// demoStarters is how many instances the demo starts at a time.
const demoStarters = 8

// runDemoWorker serves the demo's topics with a worker of the demo's own, for its
// counts (a short long poll, since a task whose retry is due waits out the poll in
// progress: README), until every instance in ids has ended, and compares the ends with
// the plan's; seen is told the ends counted so far (waitDemo).
func runDemoWorker(ctx context.Context, app *extworker.App, env *demoEnv, c *admin.Client, ids []string, plan demoPlan, out io.Writer, seen func(map[string]int)) error {
	reg := tasks.NewRegistry()
	if err := demoHandlers(env, reg.Register); err != nil {
		return err
	}
	w, err := tasks.New(app.Client(), reg, tasks.Config{Logger: app.Logger(), AsyncResponseTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(wctx) }()
	got, err := waitDemo(ctx, c, ids, 3*time.Minute, seen)
	took := time.Since(start)
	stop()
	if rerr := <-done; rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	st := w.Stats()
	tw := newTabWriter(out)
	fmt.Fprintf(tw, "outcome\texpected\tgot\n")
	for _, k := range []string{"paid", "declined", "incident"} {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", k, plan.expect[k], got[k])
	}
	tw.Flush()
	fmt.Fprintf(out, "worker %s: %d tasks fetched, %d completed, %d BPMN errors, %d retried failures, %d incidents, max %d in flight, %.1fs\n",
		w.WorkerID(), st.Fetched.Load(), st.Completed.Load(), st.BPMNErrors.Load(), st.Failures.Load(), st.Incidents.Load(), st.MaxInFlight.Load(), took.Seconds())
	fmt.Fprintf(out, "ledger: %d duplicate deliveries completed from the ledger without a provider call, %d unknown outcomes reconciled with the provider\n",
		env.replayed.Load(), env.reconciled.Load())
	for _, k := range []string{"paid", "declined", "incident"} {
		if got[k] != plan.expect[k] {
			return fmt.Errorf("demo: %d %s, expected %d", got[k], k, plan.expect[k])
		}
	}
	return nil
}

// checkDemoLedger counts the run's settled payments in the ledger, the truth about
// effects whichever worker performed them (another worker on the same topics may have
// served some of this run's invoices): one intent per paid invoice. It returns the
// settled rows.
func checkDemoLedger(ctx context.Context, env *demoEnv, plan demoPlan, out io.Writer) ([]idempotency.Row, error) {
	rows, err := env.ledger.Operations().List(ctx, idempotency.Filter{Scope: demoScope, States: []idempotency.State{idempotency.StateConfirmed, idempotency.StateReconciled}, Limit: 100_000})
	if err != nil {
		return nil, err
	}
	var mine []idempotency.Row
	for _, r := range rows {
		if strings.Contains(r.Key, plan.run) {
			mine = append(mine, r)
		}
	}
	fmt.Fprintf(out, "ledger: %d paid invoices settled, one intent each\n", len(mine))
	if len(mine) != plan.paid {
		return nil, fmt.Errorf("demo: %d invoices settled in the ledger, expected %d", len(mine), plan.paid)
	}
	return mine, nil
}

// checkDemoEvents sends every tenth paid invoice's event a second time, as a producer's
// retry or a broker's redelivery would, and reports what the inbox made of them: each
// taken once.
func checkDemoEvents(ctx context.Context, events *demoEvents, c *admin.Client, rows []idempotency.Row, plan demoPlan, out io.Writer) error {
	paid := map[string]paidEvent{}
	var again []string
	for _, r := range rows {
		invoice := strings.TrimSuffix(strings.TrimPrefix(r.Key, "invoice:"), ":v1")
		if amount, ok := plan.amounts[invoice]; ok && r.ProviderRef != nil {
			paid[invoice] = paidEvent{Invoice: invoice, AmountCents: amount, PaymentRef: *r.ProviderRef}
			if len(paid)%10 == 0 {
				again = append(again, invoice)
			}
		}
	}
	if err := events.redeliver(ctx, again, paid); err != nil {
		return err
	}
	return events.report(ctx, out, c, plan.run, plan.paid, len(again))
}

// checkDemoProvider compares the fake provider's charges for the run with the plan:
// one charge per paid invoice, none twice.
func checkDemoProvider(pay *fakeprovider.Server, plan demoPlan, out io.Writer) error {
	charges := 0
	for _, ch := range pay.Charges() {
		if strings.Contains(ch.Invoice, plan.run) {
			charges++
		}
	}
	double := pay.DoubleCharges()
	fmt.Fprintf(out, "provider: %d charge requests, %d charges for %d paid invoices, %d double charges\n", pay.Requests(), charges, plan.paid, double)
	if double != 0 || charges > plan.paid {
		return fmt.Errorf("demo: %d charges for %d paid invoices, %d double charges", charges, plan.paid, double)
	}
	return nil
}

// cockpitURL is where Cockpit shows the engine at engineURL, for an engine that serves
// the webapps next to its REST API (the Spring Boot starters and Camunda Run do,
// services/engine among them): the /engine-rest suffix replaced by
// /camunda/app/cockpit/default/, without the URL's credentials (Cockpit has a login page
// of its own). It is "" for a URL without that suffix, which says nothing of where the
// webapps are.
func cockpitURL(engineURL string) string {
	u, err := url.Parse(engineURL)
	if err != nil {
		return ""
	}
	base, ok := strings.CutSuffix(strings.TrimSuffix(u.Path, "/"), "/engine-rest")
	if !ok {
		return ""
	}
	u.User, u.RawQuery, u.Fragment, u.RawPath = nil, "", "", ""
	u.Path = base + "/camunda/app/cockpit/default/"
	return u.String()
}

// cockpitHint is " (<Cockpit's URL>)" for the demo's last line, or "" when the engine
// URL does not say where Cockpit is.
func cockpitHint(engineURL string) string {
	if u := cockpitURL(engineURL); u != "" {
		return " (" + u + ")"
	}
	return ""
}

// waitDemo waits until every instance has ended or holds an incident, and counts how,
// telling seen the counts whenever more are known. Each instance is looked at until its
// fate is known, then left alone; a sweep asks the engine a few bulk queries (demoFates),
// not one per instance, so as not to slow the engine that serves the worker.
func waitDemo(ctx context.Context, c *admin.Client, ids []string, limit time.Duration, seen func(map[string]int)) (map[string]int, error) {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	since := time.Now().Add(-time.Minute) // the engine's clock may be a little behind ours
	got := map[string]int{}
	pending := ids
	for {
		fates, err := demoFates(ctx, c, pending, since)
		if err != nil {
			return got, err
		}
		var still []string
		for _, id := range pending {
			if f := fates[id]; f != "" {
				got[f]++
			} else {
				still = append(still, id)
			}
		}
		seen(got)
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

// demoFates tells, of the instances ids (started after since), which have ended as
// "paid" or "declined" and which hold an incident ("incident"); the others are still
// going and absent from the map. Instance ids go to the engine in chunks that keep the
// query string short.
func demoFates(ctx context.Context, c *admin.Client, ids []string, since time.Time) (map[string]string, error) {
	const chunk = 50
	fates := map[string]string{}
	var ended, active []string
	for i := 0; i < len(ids); i += chunk {
		part := ids[i:min(i+chunk, len(ids))]
		hs, err := c.HistoricProcessInstances(ctx, url.Values{"processInstanceIds": {strings.Join(part, ",")}, "maxResults": {fmt.Sprint(len(part))}})
		if err != nil {
			return nil, err
		}
		for _, h := range hs {
			if h.State == "COMPLETED" {
				ended = append(ended, h.ID)
			} else {
				active = append(active, h.ID)
			}
		}
	}
	after := since.Format(camunda7.DateLayout)
	if len(ended) > 0 {
		declined := map[string]bool{}
		acts, err := c.HistoricActivityInstances(ctx, url.Values{"activityId": {"invoiceDeclined"}, "startedAfter": {after}})
		if err != nil {
			return nil, err
		}
		for _, a := range acts {
			declined[a.ProcessInstanceID] = true
		}
		for _, id := range ended {
			fates[id] = "paid"
			if declined[id] {
				fates[id] = "declined"
			}
		}
	}
	if len(active) > 0 {
		incidents, err := c.Incidents(ctx, url.Values{"processDefinitionKeyIn": {demoProcessKey}, "incidentTimestampAfter": {after}})
		if err != nil {
			return nil, err
		}
		for _, id := range active {
			fates[id] = "" // an incident of an instance that has ended meanwhile is no fate
		}
		for _, inc := range incidents {
			if f, ok := fates[inc.ProcessInstanceID]; ok && f == "" {
				fates[inc.ProcessInstanceID] = "incident"
			}
		}
	}
	return fates, nil
}

// demoFate is one instance's fate, as demoFates tells it: "paid", "declined",
// "incident", or "" while the instance is still going.
func demoFate(ctx context.Context, c *admin.Client, id string) (string, error) {
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

// redactURL is u without its password, for messages.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(an invalid URL)"
	}
	return p.Redacted()
}

// amqpURL is the broker the demo's events go through (EXTWORKER_AMQP_URL, as the worker
// reads it); empty: no events.
func amqpURL() string { return os.Getenv("EXTWORKER_AMQP_URL") }

func newTabWriter(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }
