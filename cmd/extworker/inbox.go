package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/termsafe"
)

// This file is `extworker inbox`: the operator's view of the inbox (package inbox). It
// lists the messages consumers recorded, shows one, and replays parked messages from a
// queue's dead-letter queue once what parked them is fixed.

var inboxUsage = `usage: extworker inbox <command> [flags]

commands:
  list     [--source S] [--parked] [--state STATE[,STATE...]] [--limit N] [--json]
           inbox rows, most recently changed first; --parked: the messages parked in
           a dead-letter queue, and those whose id came again with another body
  show     SOURCE MESSAGE_ID [--json]
           one inbox row, whole
  replay   (--queue Q | --topic T) (--all | MESSAGE_ID...) [--json]
           send parked messages from Q's dead-letter queue (Q.dlq) back to Q, once
           what parked them is fixed: their inbox rows go back to received and the
           consumer acts on them again. A message whose id the inbox consumed with
           another body (a conflict) stays in Q.dlq: the producer must send it under
           a new message id. Needs EXTWORKER_AMQP_URL; --topic: the same from the
           Kafka topic T.dlq to T, with EXTWORKER_KAFKA_BROKERS
  reopen   SOURCE MESSAGE_ID...
           put parked provider callbacks (which keep no copy) back to received: the
           provider's next delivery of each is acted on anew

Values are printed as they are stored, with what a terminal would act on or hide
escaped: \x1b, \u202e, \u200b, \xff (a byte that is not UTF-8), \n, \t, and \\ for a
backslash. SOURCE, MESSAGE_ID and Q are read the same way, so what list and show print
finds the message again (in single quotes for the shell: 'abc\u202efdp.exe'). An id that
begins with "-" may follow "--" (it must, when it reads as a flag: -- --all). An id list
cut short ("…") finds its message in show, when no other id begins the same.

states: ` + validInboxStatesText + ` (in any case; the upper-case
names of before, UNKNOWN_OUTCOME for unknown, are read too)`

// validInboxStatesText lists the inbox's states, in lifecycle order.
var validInboxStatesText = func() string {
	var names []string
	for _, st := range inbox.States() {
		names = append(names, string(st))
	}
	return strings.Join(names, ", ")
}()

// How much of a row's reason, and of its message id, type, action and business key,
// `inbox list` prints; `inbox show` prints them all.
const (
	reasonWidth = 60
	valueWidth  = 40
)

// runInbox is the operator's view of the inbox; inboxUsage lists its commands.
func runInbox(ctx context.Context, cfg daemon.Config, logger *slog.Logger, args []string, stdout, stderr io.Writer) error {
	c := &inboxCmd{subcommands{group: "inbox", cfg: cfg, logger: logger, stdout: stdout, stderr: stderr}}
	return c.dispatch(ctx, args, inboxUsage, map[string]func(context.Context, []string) error{
		"list":   c.list,
		"show":   c.show,
		"replay": c.replay,
		"reopen": c.reopen,
	})
}

// inboxCmd is the inbox subcommands.
type inboxCmd struct{ subcommands }

// open opens the inbox's database (the ledger's), which must be migrated.
func (c *inboxCmd) open(ctx context.Context) (*pgxpool.Pool, error) {
	_, pool, err := daemon.OpenLedger(ctx, c.cfg, c.logger, true)
	return pool, err
}

// parseInboxState reads an inbox state, in any case, in the upper-case spelling of
// before too (inbox.ParseState).
func parseInboxState(name string) (inbox.State, error) {
	st, ok := inbox.ParseState(name)
	if !ok {
		return "", fmt.Errorf("unknown state %q: valid states are %s", name, validInboxStatesText)
	}
	return st, nil
}

// ---- list

type inboxListJSON struct {
	Messages []inboxRecordJSON `json:"messages"`
}

func (c *inboxCmd) list(ctx context.Context, args []string) error {
	fs, asJSON := c.newFlags("list", "[--source S] [--parked] [--state STATE[,STATE...]] [--limit N] [--json]")
	source := fs.String("source", "", "only messages from this source (the consumer's Config.Source)")
	parked := fs.Bool("parked", false, "only messages parked in a dead-letter queue, and those whose id came again with another body")
	var states []inbox.State
	fs.Var(listFlag[inbox.State]{&states, parseInboxState}, "state", "only messages in these states, comma-separated or repeated ("+validInboxStatesText+")")
	limit := fs.Int("limit", 100, "at most this many messages")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("inbox list: unexpected arguments %q (filter with --source, --parked, --state; one message: extworker inbox show SOURCE MESSAGE_ID)", pos)
	}
	if *limit <= 0 {
		return fmt.Errorf("inbox list: --limit %d: must be at least 1", *limit)
	}
	src, err := parseValue("inbox list: --source", *source)
	if err != nil {
		return err
	}
	pool, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := inbox.List(ctx, pool, inbox.Filter{Source: src, Parked: *parked, States: states, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		out := inboxListJSON{Messages: make([]inboxRecordJSON, 0, len(rows))}
		for _, r := range rows {
			out.Messages = append(out.Messages, toInboxRecordJSON(r))
		}
		return printJSON(c.stdout, out)
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.stdout, "no inbox messages match")
		return nil
	}
	now := time.Now()
	tw := newTabWriter(c.stdout)
	fmt.Fprintln(tw, "SOURCE\tMESSAGE ID\tTYPE\tSTATE\tACTION\tBUSINESS KEY\tDELIV/DUP/ATT\tCONFLICTS\tUPDATED\tREASON")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d/%d/%d\t%d\t%s\t%s\n", cell(r.Source), cutCell(r.MessageID, valueWidth),
			cutCell(r.Type, valueWidth), r.State, cutCell(r.Action, valueWidth), cutCell(r.BusinessKey, valueWidth),
			r.Deliveries, r.Duplicates, r.Attempts, r.Conflicts, ageOf(now, r.UpdatedAt), cutCell(r.Reason, reasonWidth))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) == *limit {
		fmt.Fprintf(c.stdout, "(first %d shown; raise --limit or narrow the filter for more)\n", *limit)
	}
	return nil
}

// cell is a stored value as list and show print it: escaped (termsafe.Value: one line,
// nothing a terminal acts on or hides, no two values alike, read back by show and
// replay), "-" when empty, and a value that is "-" itself as its escape, \x2d.
func cell(v string) string {
	switch v {
	case "":
		return "-"
	case "-":
		return `\x2d`
	}
	return termsafe.Value(v)
}

// cutCell is cell(v) cut to n characters.
func cutCell(v string, n int) string { return cutEscaped(cell(v), n) }

// cutEscaped shortens v, a value as termsafe.Value prints it, to at most n characters,
// never inside an escape, ending in "…" when it was longer: what is left of it is the
// beginning of the value, which show finds the message by.
func cutEscaped(v string, n int) string {
	if utf8.RuneCountInString(v) <= n {
		return v
	}
	end, width := 0, 0
	for end < len(v) {
		size, w := escapedToken(v[end:])
		if width+w > n-1 {
			break
		}
		end, width = end+size, width+w
	}
	return strings.TrimRight(v[:end], " ") + "…"
}

// escapedToken is the length in bytes, and the width, of v's first character or escape
// (\xHH, \uHHHH, \UHHHHHHHH, \n, \\ ...).
func escapedToken(v string) (size, width int) {
	if v[0] != '\\' || len(v) < 2 {
		_, size = utf8.DecodeRuneInString(v)
		return size, 1
	}
	switch v[1] {
	case 'x':
		size = 4
	case 'u':
		size = 6
	case 'U':
		size = 10
	default:
		size = 2
	}
	size = min(size, len(v))
	return size, size
}

// ---- arguments

// flagKind is what an argument is to a flag set.
type flagKind int

const (
	notFlag   flagKind = iota
	wholeFlag          // a flag with its value, if any, in the argument (-json, --queue=Q, -h)
	valueFlag          // a flag whose value is the next argument (--queue Q)
)

// kindOf says whether arg names one of fs's flags (or -h, -help).
func kindOf(fs *flag.FlagSet, arg string) flagKind {
	if len(arg) < 2 || arg[0] != '-' {
		return notFlag
	}
	name, _, hasValue := strings.Cut(strings.TrimPrefix(arg[1:], "-"), "=")
	if name == "h" || name == "help" {
		return wholeFlag
	}
	f := fs.Lookup(name)
	if f == nil {
		return notFlag
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); hasValue || (ok && b.IsBoolFlag()) {
		return wholeFlag
	}
	return valueFlag
}

// splitArgs separates args into fs's flags (with their values) and the positional
// arguments, which may begin with "-": an argument is a flag only when it names one of
// fs's; every argument after "--" is positional.
func splitArgs(fs *flag.FlagSet, args []string) (flags, pos []string) {
	for i := 0; i < len(args); i++ {
		switch kind := kindOf(fs, args[i]); {
		case args[i] == "--":
			return flags, append(pos, args[i+1:]...)
		case kind == notFlag:
			pos = append(pos, args[i])
		case kind == valueFlag && i+1 < len(args):
			flags = append(flags, args[i], args[i+1])
			i++
		default:
			flags = append(flags, args[i])
		}
	}
	return flags, pos
}

// parseValueArgs parses args for show and replay, whose positional arguments are stored
// values (splitArgs), and reads those as list and show print them (termsafe.ParseValue).
func parseValueArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	flags, pos := splitArgs(fs, args)
	if err := fs.Parse(flags); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%s: %w", fs.Name(), err)
	}
	return parseValues(fs.Name(), pos)
}

// parseValues reads values as list and show print them (parseValue).
func parseValues(cmd string, vals []string) ([]string, error) {
	out := make([]string, len(vals))
	for i, v := range vals {
		var err error
		if out[i], err = parseValue(cmd, v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// parseValue reads a value (an id, a source, a queue or topic name) as list and show
// print it. A value written wrong, or one no inbox row holds (bytes that are not UTF-8,
// a NUL: the inbox stores such ids as "hex:" and their bytes, and a broker refuses such
// a name), is a usage error, before the database or the broker is asked.
func parseValue(what, v string) (string, error) {
	out, err := termsafe.ParseValue(v)
	if err != nil {
		return "", usageError{fmt.Errorf("%s: %w", what, err)}
	}
	if !utf8.ValidString(out) || strings.IndexByte(out, 0) >= 0 {
		return "", usageError{fmt.Errorf("%s: %s is not text an inbox row can hold: the inbox stores such an id as hex: and its bytes; name it as `extworker inbox list` prints it",
			what, termsafe.Value(out))}
	}
	return out, nil
}

// ---- show

func (c *inboxCmd) show(ctx context.Context, args []string) error {
	fs, asJSON := c.newFlags("show", "SOURCE MESSAGE_ID [--json]")
	pos, err := parseValueArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) != 2:
		return fmt.Errorf("inbox show: SOURCE and MESSAGE_ID expected (extworker inbox show SOURCE MESSAGE_ID; inbox list shows both), got %q", pos)
	case pos[0] == "" || pos[1] == "":
		return fmt.Errorf("inbox show: SOURCE and MESSAGE_ID must not be empty, got %q", pos)
	}
	pool, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := findRecord(ctx, pool, pos[0], pos[1])
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(c.stdout, toInboxRecordJSON(r))
	}
	return c.printRecord(r)
}

// findRecord finds source's message id; an id list cut short ("…"), that no message has,
// finds the one message whose id begins with what precedes the "…".
func findRecord(ctx context.Context, db inbox.Querier, source, id string) (inbox.Record, error) {
	rows, err := inbox.List(ctx, db, inbox.Filter{Source: source, MessageID: id, Limit: 1})
	if prefix, cut := strings.CutSuffix(id, "…"); err == nil && len(rows) == 0 && cut && prefix != "" {
		rows, err = inbox.List(ctx, db, inbox.Filter{Source: source, MessageIDPrefix: prefix, Limit: 2})
	}
	switch {
	case err != nil:
		return inbox.Record{}, err
	case len(rows) == 0:
		return inbox.Record{}, fmt.Errorf("inbox show: no message %q from source %q in the inbox (extworker inbox list --source %s lists that source's)",
			id, source, shellArg(source))
	case len(rows) > 1:
		return inbox.Record{}, fmt.Errorf("inbox show: more than one message id of source %q begins with %q: give the whole id "+
			"(extworker inbox list --source %s --json prints them whole)", source, strings.TrimSuffix(id, "…"), shellArg(source))
	}
	return rows[0], nil
}

// printRecord prints one inbox row, whole, and what an operator can do about it.
func (c *inboxCmd) printRecord(r inbox.Record) error {
	now := time.Now()
	tw := newTabWriter(c.stdout)
	line := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	at := func(t time.Time) string { return fmtTime(t) + " (" + ageOf(now, t) + ")" }
	line("source", cell(r.Source))
	line("queue", cell(r.Queue))
	line("message id", cell(r.MessageID))
	line("type", cell(r.Type))
	line("state", string(r.State))
	line("action", cell(r.Action))
	line("business key", cell(r.BusinessKey))
	line("process instance", cell(r.ProcessInstanceID))
	line("correlation id", cell(r.CorrelationID))
	line("body digest", cell(r.BodyDigest))
	line("reason", cell(r.Reason))
	if r.ParkKind != "" {
		line("parked for", string(r.ParkKind))
	}
	if r.MustReconcile {
		line("must reconcile", "yes: an attempt's outcome at the engine is unknown; the next one asks the engine first")
	}
	line("deliveries", strconv.Itoa(r.Deliveries))
	line("duplicates", strconv.Itoa(r.Duplicates))
	line("attempts", strconv.Itoa(r.Attempts))
	line("engine failures", strconv.Itoa(r.EngineFailures))
	line("conflicts", strconv.Itoa(r.Conflicts))
	line("replays", strconv.Itoa(r.Replays))
	line("received", at(r.ReceivedAt))
	line("updated", at(r.UpdatedAt))
	if r.ProcessedAt != nil {
		line("processed", at(*r.ProcessedAt))
	}
	if r.ParkedAt != nil {
		line("parked", at(*r.ParkedAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if hint := replayHint(r); hint != "" {
		fmt.Fprintf(c.stdout, "\n%s\n", hint)
	}
	if r.Conflicts > 0 {
		fmt.Fprintf(c.stdout, "\nconflicts: this message id came %d more time(s) with another body; those copies were parked in the dead-letter queue "+
			"and never acted on. Replaying cannot help: the producer must send them under a new message id.\n", r.Conflicts)
	}
	return nil
}

// replayHint is what `inbox show` says of replaying a parked row: the command that does
// it, as a shell takes it (its values as list prints them, quoted, the message id after
// "--": replay reads them back), or why none applies; "" for a row that is not parked.
func replayHint(r inbox.Record) string {
	switch {
	case r.State != inbox.StateFailedFinal:
		return ""
	case r.ParkKind == inbox.ParkNoID:
		return "parked: no replay applies: the message came without a message id, so the inbox cannot tell its copies apart; " +
			"the producer must send it with one"
	case r.ParkKind == inbox.ParkUnstorable:
		return "parked: no replay applies: the message's own id, type or correlation id is not text the inbox can store " +
			"(recorded escaped); the producer must send it anew"
	case r.Queue == inbox.CallbackChannel:
		return "parked: a provider callback (its body is not kept); once the reason is dealt with, reopen it and have the provider send it again:\n" +
			"  extworker inbox reopen -- " + shellArg(r.Source) + " " + shellArg(r.MessageID)
	case strings.Contains(r.Source, inbox.KafkaSource("", "")):
		return fmt.Sprintf("parked: a copy waits in the Kafka topic %s; once the reason is dealt with:\n  extworker inbox replay --topic %s -- %s",
			cell(inbox.DeadLetterQueue(r.Queue)), shellArg(r.Queue), shellArg(r.MessageID))
	case r.Queue == "":
		return "parked: a copy waits in the dead-letter queue of the queue its consumer reads (QUEUE.dlq; this row was recorded " +
			"before the inbox recorded queues); once the reason is dealt with:\n  extworker inbox replay --queue QUEUE -- " + shellArg(r.MessageID)
	}
	return fmt.Sprintf("parked: a copy waits in %s; once the reason is dealt with:\n  extworker inbox replay --queue %s -- %s",
		cell(inbox.DeadLetterQueue(r.Queue)), shellArg(r.Queue), shellArg(r.MessageID))
}

// shellArg is a stored value as an argument of a printed command: as list prints it
// (termsafe.Value), quoted for the shell.
func shellArg(v string) string { return shellQuote(termsafe.Value(v)) }

// shellWord matches what a POSIX shell takes as one word as it is.
var shellWord = regexp.MustCompile(`^[A-Za-z0-9._:/@%+=,-]+$`)

// shellQuote quotes s for a shell: as it is when it is a plain word, in single quotes when
// it is printable, else in ANSI-C quotes ($'...', bash, zsh, ksh) with every byte that is
// not printable ASCII escaped, so that a terminal shows (and acts on) nothing of it.
func shellQuote(s string) string {
	switch {
	case shellWord.MatchString(s):
		return s
	case printable(s):
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	var b strings.Builder
	b.WriteString("$'")
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	b.WriteString("'")
	return b.String()
}

// printable reports whether s is valid UTF-8 of printable characters only (no control
// characters, no bidirectional overrides).
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// ---- replay

type inboxReplayJSON struct {
	Queue           string   `json:"queue"`
	DeadLetterQueue string   `json:"dead_letter_queue"`
	Replayed        []string `json:"replayed"`
	Conflicts       []string `json:"conflicts"`
	Unreplayable    []string `json:"unreplayable"`
	Kept            int      `json:"kept"`
	NotFound        []string `json:"not_found,omitempty"`
	Error           string   `json:"error,omitempty"`
}

func (c *inboxCmd) replay(ctx context.Context, args []string) error {
	fs, asJSON := c.newFlags("replay", "(--queue Q | --topic T) (--all | MESSAGE_ID...) [--json]")
	queue := fs.String("queue", "", "the RabbitMQ queue the consumer reads; its dead-letter queue is Q.dlq")
	topic := fs.String("topic", "", "the Kafka topic the consumer reads; its dead-letter topic is T.dlq (EXTWORKER_KAFKA_BROKERS)")
	all := fs.Bool("all", false, "replay every message in the dead-letter queue, instead of the MESSAGE_IDs given")
	ids, err := parseValueArgs(fs, args)
	if err != nil {
		return err
	}
	if *queue, err = parseValue("inbox replay: --queue", *queue); err != nil {
		return err
	}
	if *topic, err = parseValue("inbox replay: --topic", *topic); err != nil {
		return err
	}
	if problems := replayProblems(*queue, *topic, *all, ids); len(problems) > 0 {
		return fmt.Errorf("inbox replay: %s", strings.Join(problems, "; "))
	}
	if err := c.replayBroker(*topic != ""); err != nil {
		return err
	}
	pool, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	named := map[string]bool{}
	for _, id := range ids {
		named[id] = true
	}
	selected := func(id string) bool { return *all || named[id] }
	var rep inbox.ReplayReport
	var replayErr error
	if *topic != "" {
		*queue = *topic // the names below are the topic's
		rep, replayErr = inbox.ReplayKafka(ctx, pool, c.cfg.KafkaBrokers, *topic, selected, c.cfg.KafkaOptions()...)
	} else {
		rep, replayErr = inbox.Replay(ctx, pool, c.cfg.AMQPURL, *queue, selected)
	}
	if replayErr != nil && len(rep.Replayed) == 0 && len(rep.Conflicts) == 0 && len(rep.Unreplayable) == 0 && rep.Kept == 0 {
		return replayErr // nothing done (no broker, no such dead-letter queue): nothing to report
	}

	var notFound []string
	for _, id := range ids {
		if named[id] && !slices.Contains(rep.Replayed, id) && !slices.Contains(rep.Conflicts, id) && !slices.Contains(rep.Unreplayable, id) {
			notFound = append(notFound, id)
			named[id] = false // named twice, reported once
		}
	}
	dlq := inbox.DeadLetterQueue(*queue)
	if *asJSON {
		out := inboxReplayJSON{Queue: *queue, DeadLetterQueue: dlq, Replayed: orEmpty(rep.Replayed), Conflicts: orEmpty(rep.Conflicts),
			Unreplayable: orEmpty(rep.Unreplayable), Kept: rep.Kept, NotFound: notFound}
		if replayErr != nil {
			out.Error = replayErr.Error()
		}
		if err := printJSON(c.stdout, out); err != nil {
			return err
		}
	} else {
		c.printReplay(*queue, rep)
	}
	switch {
	case replayErr != nil:
		return fmt.Errorf("inbox replay: stopped part-way (what is printed above was done; running it again is safe): %w", replayErr)
	case len(notFound) > 0:
		return fmt.Errorf("inbox replay: not in the dead-letter queue %s: %s (already replayed, or parked from another queue? extworker inbox list --parked)",
			dlq, strings.Join(quoteAll(notFound), ", "))
	}
	return nil
}

// reopen puts parked callbacks back to received, for their provider to send again.
func (c *inboxCmd) reopen(ctx context.Context, args []string) error {
	fs, _ := c.newFlags("reopen", "SOURCE MESSAGE_ID...")
	ids, err := parseValueArgs(fs, args)
	if err != nil {
		return err
	}
	if len(ids) < 2 || slices.Contains(ids, "") {
		return errors.New("inbox reopen: name the source and the parked messages: SOURCE MESSAGE_ID... (extworker inbox list --parked lists them)")
	}
	pool, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var notParked []string
	for _, id := range ids[1:] {
		ok, err := inbox.Reopen(ctx, pool, ids[0], id)
		if err != nil {
			return err
		}
		if !ok {
			notParked = append(notParked, id)
			continue
		}
		fmt.Fprintf(c.stdout, "reopened %s: received again; its producer's next delivery is acted on anew\n", messageIDText(id))
	}
	if len(notParked) > 0 {
		return fmt.Errorf("inbox reopen: not parked in source %s: %s", quoteAll([]string{ids[0]})[0], strings.Join(quoteAll(notParked), ", "))
	}
	return nil
}

// replayBroker checks that the broker replay needs is configured: Kafka's, or RabbitMQ's.
func (c *inboxCmd) replayBroker(kafka bool) error {
	switch {
	case kafka && len(c.cfg.KafkaBrokers) == 0:
		return daemon.ConfigError{Err: errors.New("inbox replay: EXTWORKER_KAFKA_BROKERS is not set: replay needs the brokers the consumers read from (host:port,...)")}
	case !kafka && c.cfg.AMQPURL == "":
		return daemon.ConfigError{Err: errors.New("inbox replay: EXTWORKER_AMQP_URL is not set: replay needs the broker the consumers read from (amqps://user:password@host/vhost)")}
	}
	return nil
}

// replayProblems lists what is wrong with replay's arguments.
func replayProblems(queue, topic string, all bool, ids []string) []string {
	var problems []string
	switch {
	case strings.TrimSpace(queue) == "" && strings.TrimSpace(topic) == "":
		problems = append(problems, "--queue Q or --topic T is required (the queue or Kafka topic the consumer reads; the parked messages are in Q.dlq or T.dlq)")
	case queue != "" && topic != "":
		problems = append(problems, "--queue or --topic, not both")
	}
	switch {
	case all && len(ids) > 0:
		problems = append(problems, fmt.Sprintf("--all or MESSAGE_IDs, not both (got --all and %q)", ids))
	case !all && len(ids) == 0:
		problems = append(problems, "name the messages to replay (MESSAGE_ID...; extworker inbox list --parked lists them), or --all")
	case slices.Contains(ids, ""):
		problems = append(problems, "a MESSAGE_ID is empty")
	}
	return problems
}

func (c *inboxCmd) printReplay(queue string, rep inbox.ReplayReport) {
	w, dlq := c.stdout, cell(inbox.DeadLetterQueue(queue))
	if len(rep.Replayed) == 0 {
		fmt.Fprintf(w, "replayed nothing from %s\n", dlq)
	} else {
		fmt.Fprintf(w, "replayed %d message(s) from %s to %s (their inbox rows are received again; the consumer acts on them anew):\n", len(rep.Replayed), dlq, cell(queue))
		for _, id := range rep.Replayed {
			fmt.Fprintf(w, "  %s\n", messageIDText(id))
		}
	}
	if len(rep.Conflicts) > 0 {
		fmt.Fprintf(w, "left %d message(s) in %s: the inbox consumed their message id with another body (or has no parked row of theirs), "+
			"so a replay would only park them again; the producer must send them under a new message id:\n", len(rep.Conflicts), dlq)
		for _, id := range rep.Conflicts {
			fmt.Fprintf(w, "  %s\n", messageIDText(id))
		}
	}
	if len(rep.Unreplayable) > 0 {
		fmt.Fprintf(w, "left %d message(s) in %s that a replay cannot help: they came without a message id, or with an id, type or "+
			"correlation id that is not text the inbox can store; the producer must send them anew:\n", len(rep.Unreplayable), dlq)
		for _, id := range rep.Unreplayable {
			fmt.Fprintf(w, "  %s\n", messageIDText(id))
		}
	}
	fmt.Fprintf(w, "kept %d other message(s) in %s (not selected, or, in a Kafka topic, no longer parked)\n", rep.Kept, dlq)
}

// messageIDText prints a message id as list does; a message that came without one says so.
func messageIDText(id string) string {
	if id == "" {
		return "(no message id: the producer must send it with one)"
	}
	return cell(id)
}

func quoteAll(ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.Quote(id)
	}
	return out
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// ---- JSON form

type inboxRecordJSON struct {
	Source            string     `json:"source"`
	MessageID         string     `json:"message_id"`
	Type              string     `json:"type"`
	State             string     `json:"state"`
	Action            string     `json:"action"`
	BusinessKey       string     `json:"business_key"`
	ProcessInstanceID string     `json:"process_instance_id"`
	CorrelationID     string     `json:"correlation_id"`
	BodyDigest        string     `json:"body_digest"`
	Reason            string     `json:"reason"`
	Deliveries        int        `json:"deliveries"`
	Duplicates        int        `json:"duplicates"`
	Attempts          int        `json:"attempts"`
	Conflicts         int        `json:"conflicts"`
	Replays           int        `json:"replays"`
	ReceivedAt        time.Time  `json:"received_at"`
	UpdatedAt         time.Time  `json:"updated_at"`
	ProcessedAt       *time.Time `json:"processed_at"`
	ParkedAt          *time.Time `json:"parked_at"`
	Queue             string     `json:"queue"`
	ParkKind          string     `json:"park_kind"`
	MustReconcile     bool       `json:"must_reconcile"`
	EngineFailures    int        `json:"engine_failures"`
}

func toInboxRecordJSON(r inbox.Record) inboxRecordJSON {
	return inboxRecordJSON{Source: r.Source, MessageID: r.MessageID, Type: r.Type, State: string(r.State), Action: r.Action,
		BusinessKey: r.BusinessKey, ProcessInstanceID: r.ProcessInstanceID, CorrelationID: r.CorrelationID, BodyDigest: r.BodyDigest,
		Reason: r.Reason, Deliveries: r.Deliveries, Duplicates: r.Duplicates, Attempts: r.Attempts, Conflicts: r.Conflicts,
		Replays: r.Replays, ReceivedAt: r.ReceivedAt, UpdatedAt: r.UpdatedAt, ProcessedAt: r.ProcessedAt, ParkedAt: r.ParkedAt,
		Queue: r.Queue, ParkKind: string(r.ParkKind), MustReconcile: r.MustReconcile, EngineFailures: r.EngineFailures}
}
