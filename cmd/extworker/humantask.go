package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/daemon"
)

// This file is `extworker humantask`: the operator's view of the completion service's
// commands (package humantask), which are intents of the effect ledger (scope
// humantask.complete, key "<task id>/<command id>").

const humantaskUsage = `usage: extworker humantask <command> [flags]

commands:
  commands TASK_ID [--limit N] [--json]
           the completion commands sent for a user task, oldest first: command id, the
           user who sent it, the ledger's state, the answer recorded (status and error),
           when it came and when it last changed

The commands are intents of scope ` + humantask.Scope + ` in the ledger's namespace
(EXTWORKER_LEDGER_NAMESPACE: the one the service was given, default humantask). The
ledger holds no form: a command's form is only in its request digest.`

// runHumantask is the operator's view of the completion service; humantaskUsage lists
// its commands.
func runHumantask(ctx context.Context, cfg daemon.Config, logger *slog.Logger, args []string, stdout, stderr io.Writer) error {
	h := &humantaskCmd{effectsCmd{subcommands{group: "humantask", cfg: cfg, logger: logger, stdout: stdout, stderr: stderr}}}
	return h.dispatch(ctx, args, humantaskUsage, map[string]func(context.Context, []string) error{
		"commands": h.commands,
	})
}

// humantaskCmd is the humantask subcommands; it opens the ledger as effects does.
type humantaskCmd struct{ effectsCmd }

// commandJSON is one command as `humantask commands --json` prints it.
type commandJSON struct {
	Command    string          `json:"command"`
	User       string          `json:"user"`
	State      string          `json:"state"`
	Status     *int            `json:"status"` // the recorded answer's; null while not settled
	Answer     json.RawMessage `json:"answer,omitempty"`
	Attempt    int             `json:"attempt"`
	Dispatches int             `json:"dispatches"`
	ReceivedAt time.Time       `json:"received_at"`
	UpdatedAt  time.Time       `json:"updated_at"`
}

type commandsJSON struct {
	Namespace string        `json:"namespace"`
	Task      string        `json:"task"`
	Commands  []commandJSON `json:"commands"`
}

func (h *humantaskCmd) commands(ctx context.Context, args []string) error {
	fs, asJSON := h.newFlags("commands", "TASK_ID [--limit N] [--json]")
	limit := fs.Int("limit", 100, "at most this many commands (the most recently changed)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) != 1:
		return fmt.Errorf("humantask commands: one TASK_ID expected (extworker humantask commands TASK_ID), got %d arguments: %q", len(pos), pos)
	case pos[0] == "":
		return fmt.Errorf("humantask commands: the TASK_ID is empty")
	case *limit <= 0:
		return fmt.Errorf("humantask commands: --limit %d: must be at least 1", *limit)
	}
	task := pos[0]
	l, closeLedger, err := h.open(ctx)
	if err != nil {
		return err
	}
	defer closeLedger()
	rows, err := l.List(ctx, idempotency.Filter{Scope: humantask.Scope, TaskID: task, Limit: *limit})
	if err != nil {
		return err
	}
	out := commandsJSON{Namespace: l.Namespace(), Task: task, Commands: []commandJSON{}}
	for _, r := range rows {
		id, ok := humantask.CommandOfKey(task, r.Key)
		if !ok {
			continue
		}
		c := commandJSON{Command: id, State: string(r.State), Attempt: r.Attempt, Dispatches: r.Dispatches,
			ReceivedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
		c.Status, c.Answer = recordedAnswer(r)
		// The user is the actor of the command's events (the intent's Task.Actor).
		events, err := l.Events(ctx, r.Scope, r.Key)
		if err != nil {
			return err
		}
		if len(events) > 0 {
			c.User = events[0].Actor
		}
		out.Commands = append(out.Commands, c)
	}
	slices.SortFunc(out.Commands, func(a, b commandJSON) int {
		return cmp.Or(a.ReceivedAt.Compare(b.ReceivedAt), strings.Compare(a.Command, b.Command))
	})
	if *asJSON {
		return printJSON(h.stdout, out)
	}
	if len(out.Commands) == 0 {
		fmt.Fprintf(h.stdout, "no commands for task %s (namespace %s; the service's namespace is EXTWORKER_LEDGER_NAMESPACE's)\n", tableCell(task), l.Namespace())
		return nil
	}
	now := time.Now()
	fmt.Fprintf(h.stdout, "task %s (namespace %s): %d commands\n", tableCell(task), l.Namespace(), len(out.Commands))
	tw := newTabWriter(h.stdout)
	fmt.Fprintln(tw, "COMMAND\tUSER\tSTATE\tANSWER\tRECEIVED\tUPDATED")
	for _, c := range out.Commands {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", idCell(c.Command), idCell(c.User), c.State, tableCell(answerText(c)),
			fmtTime(c.ReceivedAt), ageOf(now, c.UpdatedAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) == *limit {
		fmt.Fprintf(h.stdout, "(the %d most recently changed shown; raise --limit for more)\n", *limit)
	}
	return nil
}

// recordedAnswer is the answer the ledger recorded for a command: its status and body
// (a 200's body is its result's "body"; a refusal's status is the error code and its
// body the error message), or nil while the command is not settled.
func recordedAnswer(r idempotency.Row) (*int, json.RawMessage) {
	var body string
	status := 0
	switch r.State {
	case idempotency.StateConfirmed, idempotency.StateReconciled:
		var v struct {
			Body string `json:"body"`
		}
		if json.Unmarshal(r.Result, &v) != nil {
			return nil, nil
		}
		status, body = 200, v.Body
	case idempotency.StateRejected:
		n, err := strconv.Atoi(strOf(r.ErrorCode))
		if err != nil {
			return nil, nil
		}
		status, body = n, strOf(r.ErrorMessage)
	default:
		return nil, nil
	}
	if !json.Valid([]byte(body)) {
		return &status, nil
	}
	return &status, json.RawMessage(body)
}

// answerText is the ANSWER cell: the status and what the answer says, or "-" while the
// command is not settled.
func answerText(c commandJSON) string {
	if c.Status == nil {
		return "-"
	}
	var b struct {
		State, Error, CompletedBy, Reason string
	}
	_ = json.Unmarshal(c.Answer, &b)
	s := strconv.Itoa(*c.Status)
	for _, part := range []string{b.State, b.Error} {
		if part != "" {
			s += " " + part
		}
	}
	if b.CompletedBy != "" && *c.Status != 200 {
		s += " (by " + b.CompletedBy + ")"
	}
	if b.Reason != "" {
		s += ": " + b.Reason
	}
	return s
}
