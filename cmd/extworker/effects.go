package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/console"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/operate"
	"github.com/extworker/extworker/internal/termsafe"
)

// This file is `extworker effects`: the operator's view of the effect ledger. It lists
// intents, shows one with its history and what the engine says about its task, settles
// an intent in doubt once the operator has checked with the provider (and gives the
// task its retries back so the workflow completes from the ledger), and prunes old
// settled intents.

const effectsUsage = `usage: extworker effects <command> [flags]

commands:
  list     [--state S[,S...]] [--scope S] [--older-than DURATION] [--orphaned] [--limit N] [--json]
           intents, most recently changed first
  show     KEY [--scope S] [--json]
           one intent: its row, its events, and the engine's view of its task
  resolve  KEY --as confirmed|rejected|retry|close [--provider-ref REF] [--error-code CODE]
           [--value NAME=VALUE ...] --reason TEXT [--operator NAME] [--scope S] [--json]
           settle an unknown or held intent after checking with the provider (retry:
           send it again with the same provider key), then give its task a retry so the
           workflow completes from the ledger; or close an orphan dealt with outside the
           ledger. A verdict that declares money moved or moves it (confirmed, retry)
           above EXTWORKER_APPROVAL_THRESHOLD or without an amount, and any verdict on an
           orphan, waits for a second operator. You act as the operator registered for
           your database login (extworker operators list); --operator, if given, must be
           that name
  resolutions [--status all|pending|approved|rejected|stale] [--scope S] [--key KEY] [--limit N] [--json]
           resolution requests, newest first
  approve  ID --reason TEXT [--operator NAME] [--json]
           apply a pending resolution: a different person, with a database login of
           their own, than the one who asked (in the console or here)
  reject   ID --reason TEXT [--operator NAME] [--json]
           turn a pending resolution down (or withdraw your own); the intent is unchanged
  prune    --older-than DURATION [--json]
           turn settled intents (confirmed, rejected, reconciled, compensated) last
           changed more than DURATION ago into tombstones that refuse a second dispatch;
           DURATION is at least EXTWORKER_PROVIDER_WINDOW plus a day; orphaned, unknown,
           held and in-flight intents are kept, and so are all events

DURATION is a Go duration (90m, 36h) or a number of days (30d).
states: ` + validStatesText

// allStates are the ledger's states, in lifecycle order.
var allStates = []idempotency.State{
	idempotency.StatePrepared, idempotency.StateDispatched, idempotency.StateConfirmed, idempotency.StateRejected,
	idempotency.StateUnknown, idempotency.StateReconciled, idempotency.StateCompensated, idempotency.StateOperatorHold,
}

const validStatesText = "prepared, dispatched, confirmed, rejected, unknown, reconciled, compensated, operator_hold"

// runEffects is the operator's view of the effect ledger; effectsUsage lists its commands.
func runEffects(ctx context.Context, cfg daemon.Config, logger *slog.Logger, args []string, stdout, stderr io.Writer) error {
	e := &effectsCmd{subcommands{group: "effects", cfg: cfg, logger: logger, stdout: stdout, stderr: stderr}}
	return e.dispatch(ctx, args, effectsUsage, map[string]func(context.Context, []string) error{
		"list":        e.list,
		"show":        e.show,
		"resolve":     e.resolve,
		"resolutions": e.resolutions,
		"approve":     func(ctx context.Context, args []string) error { return e.decide(ctx, "approve", args) },
		"reject":      func(ctx context.Context, args []string) error { return e.decide(ctx, "reject", args) },
		"prune":       e.prune,
	})
}

// effectsCmd is the effects subcommands.
type effectsCmd struct{ subcommands }

// parseInterleaved parses flags placed before, between or after positional arguments
// (`show KEY --scope S` as well as `show --scope S KEY`), which flag.Parse alone stops at.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%s: %w", fs.Name(), err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil // everything after "--" is positional
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// oneKey returns the single KEY argument of show and resolve.
func oneKey(cmd string, pos []string) (string, error) {
	switch {
	case len(pos) == 0:
		return "", fmt.Errorf("effects %s: the intent KEY is missing (extworker effects %s KEY ...)", cmd, cmd)
	case len(pos) > 1:
		return "", fmt.Errorf("effects %s: one KEY expected, got %d arguments: %q", cmd, len(pos), pos)
	case pos[0] == "":
		return "", fmt.Errorf("effects %s: the intent KEY is empty", cmd)
	}
	return pos[0], nil
}

// durationFlag is a non-negative duration that also accepts whole days ("30d").
type durationFlag struct {
	d   time.Duration
	set bool
}

func (f *durationFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return f.d.String()
}

func (f *durationFlag) Set(s string) error {
	d, err := parseAge(s)
	if err != nil {
		return err
	}
	f.d, f.set = d, true
	return nil
}

func parseAge(s string) (time.Duration, error) {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok && days != "" && !strings.ContainsAny(days, "hmsuµn") {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil {
			return 0, fmt.Errorf("%q: want a duration such as 90m, 36h or 30d", s)
		}
		d = time.Duration(n * float64(24*time.Hour))
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("%q: want a duration such as 90m, 36h or 30d", s)
		}
	}
	if d < 0 {
		return 0, fmt.Errorf("%q: must not be negative", s)
	}
	return d, nil
}

func parseState(name string) (idempotency.State, error) {
	for _, s := range allStates {
		if string(s) == name {
			return s, nil
		}
	}
	return "", fmt.Errorf("unknown state %q: valid states are %s", name, validStatesText)
}

// open opens the ledger's operations, which must be migrated; close releases its pool.
func (e *effectsCmd) open(ctx context.Context) (*idempotency.Operations, func(), error) {
	l, pool, err := daemon.OpenLedger(ctx, e.cfg, e.logger, true)
	if err != nil {
		return nil, nil, err
	}
	return l.Operations(), pool.Close, nil
}

// ---- list

func (e *effectsCmd) list(ctx context.Context, args []string) error {
	fs, asJSON := e.newFlags("list", "[--state S[,S...]] [--scope S] [--older-than DURATION] [--orphaned] [--limit N] [--json]")
	var states []idempotency.State
	fs.Var(listFlag[idempotency.State]{&states, parseState}, "state", "only intents in these states, comma-separated ("+validStatesText+")")
	scope := fs.String("scope", "", "only intents of this scope, e.g. payment.collect")
	var older durationFlag
	fs.Var(&older, "older-than", "only intents whose last change is at least this old (e.g. 10m, 24h, 7d)")
	orphaned := fs.Bool("orphaned", false, "only intents whose task the engine cancelled after the effect was dispatched (compensate or close them)")
	limit := fs.Int("limit", 100, "at most this many intents")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("effects list: unexpected arguments %q (filter with --state, --scope, --older-than)", pos)
	}
	if *limit <= 0 {
		return fmt.Errorf("effects list: --limit %d: must be at least 1", *limit)
	}
	l, closeLedger, err := e.open(ctx)
	if err != nil {
		return err
	}
	defer closeLedger()
	rows, err := l.List(ctx, idempotency.Filter{States: states, Scope: *scope, OlderThan: older.d, Orphaned: *orphaned, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		out := listJSON{Namespace: l.Namespace(), Intents: make([]intentJSON, 0, len(rows))}
		for _, r := range rows {
			out.Intents = append(out.Intents, toIntentJSON(r))
		}
		return printJSON(e.stdout, out)
	}
	if len(rows) == 0 {
		fmt.Fprintf(e.stdout, "no intents match (namespace %s)\n", l.Namespace())
		return nil
	}
	now := time.Now()
	tw := newTabWriter(e.stdout)
	fmt.Fprintln(tw, "SCOPE\tKEY\tSTATE\tATTEMPT\tDISPATCHES\tPROVIDER REF\tTASK\tUPDATED")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", tableCell(r.Scope), idCell(r.Key), r.State, r.Attempt, r.Dispatches,
			tableCell(strOf(r.ProviderRef)), tableCell(strOf(r.TaskID)), ageOf(now, r.UpdatedAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) == *limit {
		fmt.Fprintf(e.stdout, "(first %d shown; raise --limit or narrow the filter for more)\n", *limit)
	}
	return nil
}

// ---- show

// The engine's view of an intent and what resolving did there are package operate's,
// shared with the operator console; the JSON forms are its types.
type (
	engineView   = operate.View
	taskJSON     = operate.Task
	incidentJSON = operate.Incident
	engineAction = operate.Action
)

type showJSON struct {
	Namespace     string           `json:"namespace"`
	Intent        intentJSON       `json:"intent,omitzero"`
	Tombstone     *tombstoneJSON   `json:"tombstone,omitempty"` // a pruned intent
	Compensates   *intentJSON      `json:"compensates,omitempty"`
	CompensatedBy []intentJSON     `json:"compensated_by,omitempty"`
	Events        []eventJSON      `json:"events"`
	Resolutions   []resolutionJSON `json:"resolutions,omitempty"`
	Engine        *engineView      `json:"engine,omitempty"`
}

func (e *effectsCmd) show(ctx context.Context, args []string) error {
	fs, asJSON := e.newFlags("show", "KEY [--scope S] [--json]")
	scope := fs.String("scope", "", "the intent's scope (needed when KEY exists in several scopes)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	key, err := oneKey("show", pos)
	if err != nil {
		return err
	}
	l, closeLedger, err := e.open(ctx)
	if err != nil {
		return err
	}
	defer closeLedger()
	row, err := findIntent(ctx, l, "show", *scope, key)
	if errors.Is(err, idempotency.ErrNotFound) && *scope != "" {
		if tomb, terr := l.Tombstone(ctx, *scope, key); terr == nil {
			return e.showTombstone(ctx, l, tomb, *asJSON)
		}
	}
	if err != nil {
		return err
	}
	events, err := l.Events(ctx, row.Scope, row.Key)
	if err != nil {
		return err
	}
	compensates, compensatedBy, err := l.Compensation(ctx, row)
	if err != nil {
		return err
	}
	reqs, err := l.Resolutions(ctx, idempotency.ResolutionFilter{Scope: row.Scope, Key: row.Key})
	if err != nil {
		return err
	}
	d := intentDetail{namespace: l.Namespace(), row: row, events: events, compensates: compensates,
		compensatedBy: compensatedBy, resolutions: reqs, engine: e.engineView(ctx, row)}
	if *asJSON {
		return printJSON(e.stdout, d.json())
	}
	d.print(e.stdout, time.Now())
	return nil
}

// intentDetail is everything show says of one intent.
type intentDetail struct {
	namespace     string
	row           idempotency.Row
	events        []idempotency.Event
	compensates   *idempotency.Row
	compensatedBy []idempotency.Row
	resolutions   []idempotency.ResolutionRequest
	engine        engineView
}

func (d intentDetail) json() showJSON {
	out := showJSON{Namespace: d.namespace, Intent: toIntentJSON(d.row), Events: make([]eventJSON, 0, len(d.events)), Engine: &d.engine,
		Resolutions: make([]resolutionJSON, 0, len(d.resolutions))}
	for _, ev := range d.events {
		out.Events = append(out.Events, toEventJSON(ev))
	}
	if d.compensates != nil {
		c := toIntentJSON(*d.compensates)
		out.Compensates = &c
	}
	for _, r := range d.compensatedBy {
		out.CompensatedBy = append(out.CompensatedBy, toIntentJSON(r))
	}
	for _, r := range d.resolutions {
		out.Resolutions = append(out.Resolutions, toResolutionJSON(r))
	}
	return out
}

func (d intentDetail) print(w io.Writer, now time.Time) {
	printIntent(w, d.namespace, d.row, now)
	if c := d.compensates; c != nil {
		fmt.Fprintf(w, "compensates: %s / %s (%s)\n", tableCell(c.Scope), tableCell(c.Key), c.State)
	}
	for _, c := range d.compensatedBy {
		fmt.Fprintf(w, "compensated by: %s / %s (%s, provider ref %s)\n", tableCell(c.Scope), tableCell(c.Key), c.State, tableCell(strOf(c.ProviderRef)))
	}
	fmt.Fprintln(w)
	printEvents(w, d.events)
	if len(d.resolutions) > 0 {
		fmt.Fprintf(w, "\nresolutions (%d):\n", len(d.resolutions))
		printResolutions(w, d.resolutions)
	}
	fmt.Fprintln(w)
	printEngineView(w, d.row, d.engine, now)
}

// showTombstone shows what prune left of an intent, and its events.
func (e *effectsCmd) showTombstone(ctx context.Context, l *idempotency.Operations, t idempotency.Tombstone, asJSON bool) error {
	events, err := l.Events(ctx, t.Scope, t.Key)
	if err != nil {
		return err
	}
	if asJSON {
		out := showJSON{Namespace: l.Namespace(), Tombstone: &tombstoneJSON{ID: t.ID, Scope: t.Scope, Key: t.Key, State: string(t.State),
			RequestDigest: t.Digest, ProviderKey: t.ProviderKey, ProviderRef: t.ProviderRef, SettledAt: t.SettledAt, PrunedAt: t.PrunedAt},
			Events: make([]eventJSON, 0, len(events))}
		for _, ev := range events {
			out.Events = append(out.Events, toEventJSON(ev))
		}
		return printJSON(e.stdout, out)
	}
	tw := newTabWriter(e.stdout)
	fmt.Fprintf(tw, "intent\t%s / %s (pruned: a tombstone refuses to dispatch it again)\n", tableCell(t.Scope), tableCell(t.Key))
	fmt.Fprintf(tw, "namespace\t%s\n", l.Namespace())
	fmt.Fprintf(tw, "state\t%s\n", t.State)
	fmt.Fprintf(tw, "provider key\t%s\n", t.ProviderKey)
	fmt.Fprintf(tw, "provider ref\t%s\n", tableCell(strOf(t.ProviderRef)))
	fmt.Fprintf(tw, "request digest\t%s\n", t.Digest)
	fmt.Fprintf(tw, "settled\t%s\n", fmtTime(t.SettledAt))
	fmt.Fprintf(tw, "pruned\t%s\n", fmtTime(t.PrunedAt))
	_ = tw.Flush()
	fmt.Fprintln(e.stdout)
	printEvents(e.stdout, events)
	return nil
}

type tombstoneJSON struct {
	ID            int64     `json:"id"`
	Scope         string    `json:"scope"`
	Key           string    `json:"key"`
	State         string    `json:"state"`
	RequestDigest string    `json:"request_digest"`
	ProviderKey   string    `json:"provider_key"`
	ProviderRef   *string   `json:"provider_ref"`
	SettledAt     time.Time `json:"settled_at"`
	PrunedAt      time.Time `json:"pruned_at"`
}

// findIntent returns the intent KEY in scope, or, with no scope, in the only scope that
// has it.
func findIntent(ctx context.Context, l *idempotency.Operations, cmd, scope, key string) (idempotency.Row, error) {
	if scope != "" {
		return l.Get(ctx, scope, key)
	}
	rows, err := l.List(ctx, idempotency.Filter{Key: key, Limit: 1000})
	if err != nil {
		return idempotency.Row{}, err
	}
	switch len(rows) {
	case 0:
		return idempotency.Row{}, fmt.Errorf("%w: no intent with key %q in any scope of namespace %s", idempotency.ErrNotFound, key, l.Namespace())
	case 1:
		return rows[0], nil
	}
	scopes := make([]string, len(rows))
	for i, r := range rows {
		scopes[i] = r.Scope
	}
	return idempotency.Row{}, fmt.Errorf("effects %s: key %q exists in %d scopes (%s): choose one with --scope", cmd, key, len(rows), strings.Join(scopes, ", "))
}

// engine is the engine as package operate reaches it: the client is made when needed.
func (e *effectsCmd) engine() operate.Engine {
	return operate.Engine{URL: daemon.RedactURL(e.cfg.EngineURL), Dial: func() (*camunda7.Client, error) { return daemon.NewClient(e.cfg, e.logger) }}
}

// engineView asks the engine about the intent's task and its process instance's open
// incidents (operate.Engine.View).
func (e *effectsCmd) engineView(ctx context.Context, row idempotency.Row) engineView {
	return e.engine().View(ctx, row)
}

func printIntent(w io.Writer, namespace string, r idempotency.Row, now time.Time) {
	tw := newTabWriter(w)
	line := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	line("intent", fmt.Sprintf("%s / %s", r.Scope, r.Key))
	line("namespace", namespace)
	line("state", string(r.State))
	line("attempt", strconv.Itoa(r.Attempt))
	line("dispatches", strconv.Itoa(r.Dispatches))
	line("reconciliations", strconv.Itoa(r.Reconciliations))
	if r.AbandonedAttempts > 0 {
		line("abandoned attempts", strconv.Itoa(r.AbandonedAttempts))
	}
	if r.Amount != nil {
		line("amount", strconv.FormatInt(*r.Amount, 10)+" (minor units)")
	}
	line("provider key", r.ProviderKey)
	line("provider ref", tableCell(strOf(r.ProviderRef)))
	if r.ErrorCode != nil || r.ErrorMessage != nil {
		line("error code", tableCell(strOf(r.ErrorCode)))
		line("error message", tableCell(strOf(r.ErrorMessage)))
	}
	if len(r.Result) > 0 && string(r.Result) != "null" {
		line("result", string(r.Result))
	}
	line("request digest", r.Digest)
	if r.LeaseOwner != nil || r.LeaseUntil != nil {
		lease := tableCell(strOf(r.LeaseOwner))
		if r.LeaseUntil != nil {
			lease += " until " + fmtTime(*r.LeaseUntil)
		}
		line("lease", lease)
	}
	line("task", tableCell(strOf(r.TaskID)))
	line("process instance", tableCell(strOf(r.ProcessInstanceID)))
	line("business key", tableCell(strOf(r.BusinessKey)))
	if r.FirstDispatchedAt != nil {
		line("first dispatched", fmtTime(*r.FirstDispatchedAt)+" ("+ageOf(now, *r.FirstDispatchedAt)+")")
	}
	if r.LastDispatchedAt != nil {
		line("last dispatched", fmtTime(*r.LastDispatchedAt)+" ("+ageOf(now, *r.LastDispatchedAt)+")")
	}
	if r.OrphanedAt != nil {
		line("orphaned", fmtTime(*r.OrphanedAt)+": "+tableCell(strOf(r.OrphanReason)))
	}
	line("created", fmtTime(r.CreatedAt)+" ("+ageOf(now, r.CreatedAt)+")")
	line("updated", fmtTime(r.UpdatedAt)+" ("+ageOf(now, r.UpdatedAt)+")")
	_ = tw.Flush()
}

func printEvents(w io.Writer, events []idempotency.Event) {
	fmt.Fprintf(w, "events (%d):\n", len(events))
	if len(events) == 0 {
		return
	}
	tw := newTabWriter(w)
	fmt.Fprintln(tw, "  TIME\tTRANSITION\tATTEMPT\tACTOR\tDB USER\tTASK\tREASON")
	for _, ev := range events {
		from := "(new)"
		if ev.FromState != nil {
			from = *ev.FromState
		}
		fmt.Fprintf(tw, "  %s\t%s -> %s\t%d\t%s\t%s\t%s\t%s\n", fmtTime(ev.At), from, ev.ToState, ev.Attempt, tableCell(ev.Actor),
			tableCell(ev.DBUser), tableCell(strOf(ev.TaskID)), oneLine(ev.Reason))
	}
	_ = tw.Flush()
}

// userTaskState is where a human-task command's user task stands: waiting (for whom),
// or ended (completed or removed, and when).
func userTaskState(u *operate.UserTask) string {
	switch {
	case !u.Ended:
		s := u.ID + " waiting, assigned to nobody"
		if u.Assignee != "" {
			s = u.ID + " waiting, assigned to " + tableCell(u.Assignee)
		}
		if u.Suspended {
			s += ", suspended"
		}
		return s
	case u.EndTime.IsZero():
		return u.ID + " not waiting, and not in the engine's history"
	}
	return fmt.Sprintf("%s ended (%s) at %s", u.ID, tableCell(u.DeleteReason), fmtTime(u.EndTime))
}

func printEngineView(w io.Writer, r idempotency.Row, v engineView, now time.Time) {
	switch {
	case v.TaskID == "" && strOf(r.ProcessInstanceID) == "":
		fmt.Fprintln(w, "engine: no task recorded for this intent")
		return
	case v.UserTask != nil:
		fmt.Fprintf(w, "engine: user task %s\n", userTaskState(v.UserTask))
	case v.TaskGone:
		fmt.Fprintf(w, "engine: task %s gone (completed or cancelled)\n", v.TaskID)
	case v.Task != nil:
		t := v.Task
		fmt.Fprintf(w, "engine: task %s (%s)\n", t.ID, v.URL)
		tw := newTabWriter(w)
		line := func(k, val string) { fmt.Fprintf(tw, "  %s\t%s\n", k, val) }
		line("topic", t.TopicName)
		line("activity", t.ActivityID)
		line("process instance", t.ProcessInstanceID)
		line("worker", tableCell(t.WorkerID))
		retries := "not set (no failure reported)"
		if t.Retries != nil {
			retries = strconv.Itoa(*t.Retries)
			if *t.Retries == 0 {
				retries += " (incident)"
			}
		}
		line("retries", retries)
		lock := "not locked"
		if t.LockExpirationTime != nil {
			if t.LockExpirationTime.After(now) {
				lock = "expires " + fmtTime(*t.LockExpirationTime)
			} else {
				lock = "expired " + fmtTime(*t.LockExpirationTime)
			}
		}
		line("lock", lock)
		if t.Suspended {
			line("suspended", "yes")
		}
		line("error message", tableCell(oneLine(t.ErrorMessage)))
		_ = tw.Flush()
	}
	if v.Error != "" {
		fmt.Fprintf(w, "engine: %s\n", v.Error)
		return
	}
	if len(v.Incidents) == 0 {
		fmt.Fprintln(w, "open incidents: none")
		return
	}
	fmt.Fprintf(w, "open incidents (%d):\n", len(v.Incidents))
	tw := newTabWriter(w)
	fmt.Fprintln(tw, "  ID\tTYPE\tACTIVITY\tSINCE\tMESSAGE")
	for _, in := range v.Incidents {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", in.ID, in.Type, tableCell(in.Activity), fmtTime(in.At), tableCell(oneLine(in.Message)))
	}
	_ = tw.Flush()
}

// ---- resolve

type resolveJSON struct {
	Namespace string          `json:"namespace"`
	Intent    intentJSON      `json:"intent"`
	Pending   *resolutionJSON `json:"pending,omitempty"` // waiting for a second operator
	Engine    *engineAction   `json:"engine,omitempty"`  // what was done in the engine, once applied
}

func (e *effectsCmd) resolve(ctx context.Context, args []string) error {
	fs, asJSON := e.newFlags("resolve", "KEY --as confirmed|rejected|retry|close [--provider-ref REF] [--error-code CODE] [--value NAME=VALUE ...] --reason TEXT [--operator NAME] [--scope S] [--json]")
	as := fs.String("as", "", "the verdict after checking with the provider: confirmed, rejected, retry (it never got it: send again), or close (an orphan dealt with outside the ledger) (required)")
	ref := fs.String("provider-ref", "", "the provider's reference of the effect (required with --as confirmed)")
	code := fs.String("error-code", "", "the decline's code, thrown as the BPMN error (with --as rejected; default REJECTED)")
	reason := fs.String("reason", "", "why, for the audit trail, e.g. what the provider's dashboard shows (required)")
	operator := fs.String("operator", "", "your operator name, checked against the one registered for your database login (default: that one)")
	scope := fs.String("scope", "", "the intent's scope (needed when KEY exists in several scopes)")
	values := keyValues{}
	fs.Var(values, "value", "a result value the task completes with, NAME=VALUE (repeatable; with --as confirmed), e.g. paymentRef=ch_123")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	key, err := oneKey("resolve", pos)
	if err != nil {
		return err
	}
	// Everything the ledger would refuse is refused here, before anything is opened.
	state, err := resolveVerdict(*as, *reason, *ref, *code, len(values) > 0)
	if err != nil {
		return err
	}
	if err := typedText("resolve", [][2]string{{"--reason", *reason}, {"--provider-ref", *ref}, {"--error-code", *code}}, values); err != nil {
		return err
	}

	l, closeLedger, err := e.open(ctx)
	if err != nil {
		return err
	}
	defer closeLedger()
	row, err := findIntent(ctx, l, "resolve", *scope, key)
	if err != nil {
		return err
	}
	res, err := l.Resolve(ctx, row.Scope, row.Key, idempotency.Resolution{As: state, ProviderRef: strings.TrimSpace(*ref),
		Values: values.orNil(), ErrorCode: *code, Reason: *reason, Operator: strings.TrimSpace(*operator)})
	if err != nil {
		return err
	}
	if res.Pending != nil {
		return e.pending(l.Namespace(), res.Row, *res.Pending, *asJSON)
	}
	return e.applied(ctx, "resolve", l, res.Row, *asJSON)
}

// typedText refuses, as a usage error, what an operator typed that the console's form
// would refuse (console.CheckTypedReason and the rest: a control character, a byte that is
// not UTF-8, an invisible character, too much), before anything is opened: the tool
// stores nothing the console would not.
func typedText(cmd string, flags [][2]string, values keyValues) error {
	checks := map[string]func(string) error{"--reason": console.CheckTypedReason, "--provider-ref": console.CheckTypedProviderRef,
		"--error-code": console.CheckTypedErrorCode}
	var problems []string
	for _, f := range flags {
		if err := checks[f[0]](f[1]); err != nil {
			problems = append(problems, f[0]+": "+err.Error())
		}
	}
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := console.CheckTypedValues(name + "=" + fmt.Sprint(values[name])); err != nil {
			problems = append(problems, "--value: "+err.Error())
		}
	}
	if len(problems) > 0 {
		return usageError{fmt.Errorf("effects %s: %s", cmd, strings.Join(problems, "; "))}
	}
	return nil
}

// resolveVerdict reads resolve's flags into the verdict's state, refusing in one error
// every combination the ledger would refuse.
func resolveVerdict(as, reason, ref, code string, withValues bool) (idempotency.State, error) {
	var problems []string
	var state idempotency.State
	switch as {
	case "":
		problems = append(problems, "--as confirmed|rejected|retry|close is required")
	case string(idempotency.StateConfirmed), string(idempotency.StateRejected):
		state = idempotency.State(as)
	case "retry":
		state = idempotency.StatePrepared
	case "close":
		state = idempotency.VerdictClose
	default:
		problems = append(problems, fmt.Sprintf("--as %q: must be confirmed, rejected, retry or close", as))
	}
	if strings.TrimSpace(reason) == "" {
		problems = append(problems, "--reason is required (what you checked, for the audit trail)")
	}
	if state == idempotency.StateConfirmed && strings.TrimSpace(ref) == "" {
		problems = append(problems, "--provider-ref is required with --as confirmed (the provider's reference of the effect)")
	}
	if state != idempotency.StateRejected && state != "" && code != "" {
		problems = append(problems, "--error-code only goes with --as rejected")
	}
	if (state == idempotency.StatePrepared || state == idempotency.VerdictClose) && (ref != "" || withValues) {
		problems = append(problems, "--provider-ref and --value go with --as confirmed, not "+as)
	}
	if len(problems) > 0 {
		return "", fmt.Errorf("effects resolve: %s", strings.Join(problems, "; "))
	}
	return state, nil
}

// pending reports a verdict recorded and waiting for a second operator.
func (e *effectsCmd) pending(namespace string, row idempotency.Row, r idempotency.ResolutionRequest, asJSON bool) error {
	p := toResolutionJSON(r)
	if asJSON {
		return printJSON(e.stdout, resolveJSON{Namespace: namespace, Intent: toIntentJSON(row), Pending: &p})
	}
	fmt.Fprintf(e.stdout, "ledger: resolution #%d of %s/%s recorded by %s: %s; the intent stays %s until a second operator decides:\n",
		p.ID, row.Scope, row.Key, p.RequestedBy, p.Verdict, row.State)
	fmt.Fprintf(e.stdout, "  extworker effects approve %d --reason TEXT   (another person, on their own login or in the console)\n", p.ID)
	fmt.Fprintf(e.stdout, "  extworker effects reject %d --reason TEXT\n", p.ID)
	return nil
}

// applied reports a verdict applied to row, and gives its task a retry when it needs one.
func (e *effectsCmd) applied(ctx context.Context, cmd string, l *idempotency.Operations, row idempotency.Row, asJSON bool) error {
	namespace := l.Namespace()
	act := e.resumeTask(ctx, row)
	if asJSON {
		if err := printJSON(e.stdout, resolveJSON{Namespace: namespace, Intent: toIntentJSON(row), Engine: &act}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.stdout, "ledger: %s/%s is now %s", row.Scope, row.Key, row.State)
		switch row.State {
		case idempotency.StateConfirmed:
			fmt.Fprintf(e.stdout, " (provider ref %s)", strOf(row.ProviderRef))
		case idempotency.StateRejected:
			fmt.Fprintf(e.stdout, " (error code %s)", strOf(row.ErrorCode))
		case idempotency.StatePrepared:
			fmt.Fprint(e.stdout, " (its next attempt sends it again with provider key "+row.ProviderKey+")")
		}
		if row.OrphanClosedAt != nil {
			fmt.Fprint(e.stdout, "; its orphan is closed")
		}
		fmt.Fprintf(e.stdout, ", by %s\n", decidedBy(ctx, l, row))
		fmt.Fprintf(e.stdout, "engine: %s\n", act.Message)
	}
	if act.Action == "failed" {
		return fmt.Errorf("effects %s: the ledger is resolved, but the engine step failed: %s", cmd, act.Message)
	}
	return nil
}

// decidedBy is who the database recorded as deciding row's last change (the actor of its
// last event): the person registered for the login, never a name typed in.
func decidedBy(ctx context.Context, l *idempotency.Operations, row idempotency.Row) string {
	events, err := l.Events(ctx, row.Scope, row.Key)
	if err != nil || len(events) == 0 {
		return "an operator (extworker effects show names who)"
	}
	return events[len(events)-1].Actor
}

// ---- resolutions, approve, reject

type resolutionsJSON struct {
	Namespace   string           `json:"namespace"`
	Resolutions []resolutionJSON `json:"resolutions"`
}

type resolutionJSON struct {
	ID              int64           `json:"id"`
	Scope           string          `json:"scope"`
	Key             string          `json:"key"`
	Verdict         string          `json:"verdict"`
	As              string          `json:"as"`
	FromState       string          `json:"from_state"`
	ProviderRef     *string         `json:"provider_ref"`
	Values          json.RawMessage `json:"values,omitempty"`
	ErrorCode       *string         `json:"error_code"`
	Reason          string          `json:"reason"`
	RequestedBy     string          `json:"requested_by"`
	RequestedDBUser string          `json:"requested_db_user"`
	RequestedAt     time.Time       `json:"requested_at"`
	Status          string          `json:"status"`
	DecidedBy       *string         `json:"decided_by"`
	DecidedDBUser   *string         `json:"decided_db_user"`
	DecidedAt       *time.Time      `json:"decided_at"`
	DecisionReason  *string         `json:"decision_reason"`
}

func toResolutionJSON(r idempotency.ResolutionRequest) resolutionJSON {
	as := string(r.As)
	switch r.As {
	case idempotency.StatePrepared:
		as = "retry"
	case idempotency.VerdictClose:
		as = "close"
	}
	j := resolutionJSON{ID: r.ID, Scope: r.Scope, Key: r.Key, Verdict: r.VerdictText(), As: as, FromState: string(r.FromState),
		ProviderRef: r.ProviderRef, ErrorCode: r.ErrorCode, Reason: r.Reason, RequestedBy: r.RequestedBy, RequestedDBUser: r.RequestedDBUser,
		RequestedAt: r.RequestedAt, Status: string(r.Status), DecidedBy: r.DecidedBy, DecidedDBUser: r.DecidedDBUser, DecidedAt: r.DecidedAt,
		DecisionReason: r.DecisionReason}
	if len(r.Values) > 0 && string(r.Values) != "null" && json.Valid(r.Values) {
		j.Values = json.RawMessage(r.Values)
	}
	return j
}

var resolutionStatuses = []idempotency.ResolutionStatus{idempotency.ResolutionPending, idempotency.ResolutionApproved,
	idempotency.ResolutionRejected, idempotency.ResolutionStale}

func (e *effectsCmd) resolutions(ctx context.Context, args []string) error {
	fs, asJSON := e.newFlags("resolutions", "[--status all|pending|approved|rejected|stale] [--scope S] [--key KEY] [--limit N] [--json]")
	status := fs.String("status", "all", "only requests in this status: all, pending, approved, rejected or stale")
	scope := fs.String("scope", "", "only requests for intents of this scope")
	key := fs.String("key", "", "only requests for this intent key")
	limit := fs.Int("limit", 100, "at most this many requests")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("effects resolutions: unexpected arguments %q (filter with --status, --scope, --key)", pos)
	}
	if *status == "all" { // as the console's ?status=all: no filter
		*status = ""
	}
	if *status != "" && !slices.Contains(resolutionStatuses, idempotency.ResolutionStatus(*status)) {
		return fmt.Errorf("effects resolutions: --status %q: want all, pending, approved, rejected or stale", *status)
	}
	if *limit <= 0 {
		return fmt.Errorf("effects resolutions: --limit %d: must be at least 1", *limit)
	}
	l, closeLedger, err := e.open(ctx)
	if err != nil {
		return err
	}
	defer closeLedger()
	reqs, err := l.Resolutions(ctx, idempotency.ResolutionFilter{Status: idempotency.ResolutionStatus(*status), Scope: *scope, Key: *key, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		out := resolutionsJSON{Namespace: l.Namespace(), Resolutions: make([]resolutionJSON, 0, len(reqs))}
		for _, r := range reqs {
			out.Resolutions = append(out.Resolutions, toResolutionJSON(r))
		}
		return printJSON(e.stdout, out)
	}
	if len(reqs) == 0 {
		fmt.Fprintf(e.stdout, "no resolution requests match (namespace %s)\n", l.Namespace())
		return nil
	}
	printResolutions(e.stdout, reqs)
	return nil
}

func printResolutions(w io.Writer, reqs []idempotency.ResolutionRequest) {
	tw := newTabWriter(w)
	fmt.Fprintln(tw, "ID\tSCOPE\tKEY\tVERDICT\tSTATUS\tREQUESTED BY\tREQUESTED\tDECIDED BY\tREASON")
	for _, r := range reqs {
		decided := "-"
		if r.DecidedBy != nil {
			decided = fmt.Sprintf("%s (%s)", *r.DecidedBy, strOf(r.DecidedDBUser))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s (%s)\t%s\t%s\t%s\n", r.ID, tableCell(r.Scope), idCell(r.Key), tableCell(r.VerdictText()),
			r.Status, tableCell(r.RequestedBy), tableCell(r.RequestedDBUser), fmtTime(r.RequestedAt), tableCell(decided), tableCell(r.Reason))
	}
	_ = tw.Flush()
}

// decide is approve and reject.
func (e *effectsCmd) decide(ctx context.Context, cmd string, args []string) error {
	fs, asJSON := e.newFlags(cmd, "ID --reason TEXT [--operator NAME] [--json]")
	reason := fs.String("reason", "", "why, for the audit trail (required)")
	operator := fs.String("operator", "", "your operator name, checked against the one registered for your database login (default: that one)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	var problems []string
	var id int64
	switch {
	case len(pos) != 1:
		problems = append(problems, fmt.Sprintf("one resolution ID expected (extworker effects resolutions --status pending lists them), got %q", pos))
	default:
		if id, err = strconv.ParseInt(strings.TrimPrefix(pos[0], "#"), 10, 64); err != nil || id <= 0 {
			problems = append(problems, fmt.Sprintf("resolution ID %q: want a number such as 12", pos[0]))
		}
	}
	if strings.TrimSpace(*reason) == "" {
		problems = append(problems, "--reason is required (what you checked, for the audit trail)")
	}
	if len(problems) > 0 {
		return fmt.Errorf("effects %s: %s", cmd, strings.Join(problems, "; "))
	}
	if err := typedText(cmd, [][2]string{{"--reason", *reason}}, nil); err != nil {
		return err
	}
	l, closeLedger, err := e.open(ctx)
	if err != nil {
		return err
	}
	defer closeLedger()
	d := idempotency.Decision{Operator: strings.TrimSpace(*operator), Reason: *reason}
	if cmd == "reject" {
		req, err := l.RejectResolution(ctx, id, d)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, toResolutionJSON(req))
		}
		fmt.Fprintf(e.stdout, "ledger: resolution #%d of %s/%s (%s) rejected by %s; the intent is unchanged\n",
			req.ID, req.Scope, req.Key, req.VerdictText(), strOf(req.DecidedBy))
		return nil
	}
	res, err := l.Approve(ctx, id, d)
	if err != nil {
		return err
	}
	return e.applied(ctx, "approve", l, res.Row, *asJSON)
}

// resumeTask gives the resolved intent's task a retry if it ran out of them
// (operate.Engine.ResumeTask).
func (e *effectsCmd) resumeTask(ctx context.Context, row idempotency.Row) engineAction {
	return e.engine().ResumeTask(ctx, row)
}

// ---- prune

type pruneJSON struct {
	Namespace string `json:"namespace"`
	OlderThan string `json:"older_than"`
	Pruned    int64  `json:"pruned"`
}

func (e *effectsCmd) prune(ctx context.Context, args []string) error {
	fs, asJSON := e.newFlags("prune", "--older-than DURATION [--json]")
	var older durationFlag
	fs.Var(&older, "older-than", "prune settled intents whose last change is older than this, e.g. 720h or 30d; at least the provider window plus a day (required)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("effects prune: unexpected arguments %q", pos)
	}
	if !older.set {
		return errors.New("effects prune: --older-than DURATION is required (e.g. --older-than 30d); settled intents last changed before then are pruned")
	}
	l, closeLedger, err := e.open(ctx)
	if err != nil {
		return err
	}
	defer closeLedger()
	n, err := l.Prune(ctx, older.d)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, pruneJSON{Namespace: l.Namespace(), OlderThan: older.d.String(), Pruned: n})
	}
	fmt.Fprintf(e.stdout, "pruned %d settled intents last changed more than %v ago into tombstones (namespace %s); orphaned, unknown, held and in-flight intents and all events are kept\n",
		n, older.d, l.Namespace())
	return nil
}

// ---- JSON forms

type intentJSON struct {
	ID                int64           `json:"id"`
	Namespace         string          `json:"namespace"`
	Scope             string          `json:"scope"`
	Key               string          `json:"key"`
	State             string          `json:"state"`
	Attempt           int             `json:"attempt"`
	Dispatches        int             `json:"dispatches"`
	Reconciliations   int             `json:"reconciliations"`
	ProviderKey       string          `json:"provider_key"`
	ProviderRef       *string         `json:"provider_ref"`
	Result            json.RawMessage `json:"result,omitempty"`
	ErrorCode         *string         `json:"error_code"`
	ErrorMessage      *string         `json:"error_message"`
	RequestDigest     string          `json:"request_digest"`
	LeaseOwner        *string         `json:"lease_owner"`
	LeaseUntil        *time.Time      `json:"lease_until"`
	TaskID            *string         `json:"task_id"`
	ProcessInstanceID *string         `json:"process_instance_id"`
	BusinessKey       *string         `json:"business_key"`
	FirstDispatchedAt *time.Time      `json:"first_dispatched_at"`
	LastDispatchedAt  *time.Time      `json:"last_dispatched_at"`
	OrphanedAt        *time.Time      `json:"orphaned_at"`
	OrphanReason      *string         `json:"orphan_reason"`
	CreatedAt         time.Time       `json:"created_at"`
	UpdatedAt         time.Time       `json:"updated_at"`
	AbandonedAttempts int             `json:"abandoned_attempts"`
	Amount            *int64          `json:"amount"`
}

func toIntentJSON(r idempotency.Row) intentJSON {
	j := intentJSON{ID: r.ID, Namespace: r.Namespace, Scope: r.Scope, Key: r.Key, State: string(r.State), Attempt: r.Attempt,
		Dispatches: r.Dispatches, Reconciliations: r.Reconciliations, ProviderKey: r.ProviderKey, ProviderRef: r.ProviderRef,
		ErrorCode: r.ErrorCode, ErrorMessage: r.ErrorMessage, RequestDigest: r.Digest, LeaseOwner: r.LeaseOwner,
		LeaseUntil: r.LeaseUntil, TaskID: r.TaskID, ProcessInstanceID: r.ProcessInstanceID, BusinessKey: r.BusinessKey,
		FirstDispatchedAt: r.FirstDispatchedAt, LastDispatchedAt: r.LastDispatchedAt, OrphanedAt: r.OrphanedAt, OrphanReason: r.OrphanReason,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, AbandonedAttempts: r.AbandonedAttempts, Amount: r.Amount}
	if len(r.Result) > 0 && json.Valid(r.Result) {
		j.Result = json.RawMessage(r.Result)
	}
	return j
}

type listJSON struct {
	Namespace string       `json:"namespace"`
	Intents   []intentJSON `json:"intents"`
}

type eventJSON struct {
	ID        int64     `json:"id"`
	At        time.Time `json:"at"`
	FromState *string   `json:"from_state"`
	ToState   string    `json:"to_state"`
	Attempt   int       `json:"attempt"`
	Actor     string    `json:"actor"`
	TaskID    *string   `json:"task_id"`
	Reason    string    `json:"reason"`
	DBUser    string    `json:"db_user"`
}

func toEventJSON(e idempotency.Event) eventJSON {
	return eventJSON{ID: e.ID, At: e.At, FromState: e.FromState, ToState: string(e.ToState), Attempt: e.Attempt,
		Actor: e.Actor, TaskID: e.TaskID, Reason: e.Reason, DBUser: e.DBUser}
}

// printJSON prints v as indented JSON, with the characters the terminal writer would
// escape written as JSON escapes: the JSON stays valid, and decodes to the stored values.
func printJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(termsafe.JSON(buf.Bytes()))
	return err
}

// ---- text helpers

func newTabWriter(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// tableCell makes a value safe for one table cell: "-" when empty, no tabs or newlines.
func tableCell(s string) string {
	if s == "" {
		return "-"
	}
	return oneLine(s)
}

// lineBreaks turns tabs and line breaks into spaces.
var lineBreaks = strings.NewReplacer("\t", " ", "\r\n", " ", "\n", " ", "\r", " ")

func oneLine(s string) string { return lineBreaks.Replace(s) }

// idCell is tableCell for a name that came from outside (an intent key, a user, a
// command id): quoted, Go-style, when it holds a space or a quote, so that it cannot
// read as more than one column of the table.
func idCell(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || r == '"' }) {
		return strconv.Quote(s)
	}
	return tableCell(s)
}

func strOf(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func fmtTime(t time.Time) string { return t.Local().Format("2006-01-02 15:04:05 MST") }

// ageOf says how long ago t was, short: "12s ago", "26m ago", "2h5m ago", "3d ago"
// (the console's Ago, so both print an age alike).
var ageOf = console.Ago

// keyValues is a repeatable NAME=VALUE flag.
type keyValues map[string]any

func (kv keyValues) String() string { return fmt.Sprint(map[string]any(kv)) }

func (kv keyValues) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	switch _, dup := kv[name]; {
	case !ok || name == "":
		return fmt.Errorf("%+q: want NAME=VALUE", s)
	case !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%+q: not valid UTF-8 text (the task would complete with other bytes than these)", s)
	case dup:
		return fmt.Errorf("%+q: %s is given twice", s, name)
	}
	kv[name] = value
	return nil
}

func (kv keyValues) orNil() map[string]any {
	if len(kv) == 0 {
		return nil
	}
	return kv
}
