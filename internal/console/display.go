package console

import (
	"encoding/json"
	"fmt"
	"html/template"
	"sort"
	"time"

	"github.com/extworker/extworker/idempotency"
)

// This file is how the pages show verdicts and times.

// verdictView is what a resolution decides, as an approver must see it before
// approving: the verdict, and everything it would write.
type verdictView struct {
	Label, What string
	Confirmed   bool
	ProviderRef string
	ErrorCode   string
	Values      []namedValue
	// ValuesText is the values as stored when they are not a JSON object.
	ValuesText string
}

type namedValue struct{ Name, Value string }

// verdictOf is req's verdict for a page.
func verdictOf(req idempotency.ResolutionRequest) verdictView {
	v := verdictView{Label: verdictLabel(req.As), ProviderRef: deref(req.ProviderRef)}
	switch req.As {
	case idempotency.StateConfirmed:
		v.What, v.Confirmed = "the provider has it; the task completes with these values", true
		v.Values, v.ValuesText = namedValues(req.Values)
	case idempotency.StateRejected:
		v.What, v.ErrorCode = "it did not happen; the task takes its error path", or(deref(req.ErrorCode), "REJECTED (the default)")
	case idempotency.StatePrepared:
		v.What = "the provider never got it; the task sends it again with the same provider key"
	case idempotency.VerdictClose:
		v.What = "the orphan was dealt with outside the ledger; the intent keeps its state and leaves the orphan queue"
	}
	return v
}

// verdictLabel names a verdict as the pages do.
func verdictLabel(as idempotency.State) string {
	switch as {
	case idempotency.StatePrepared:
		return "retry"
	case idempotency.VerdictClose:
		return "close the orphan"
	}
	return string(as)
}

// namedValues are a resolution's result values by name, or their JSON text when it is
// not an object.
func namedValues(raw []byte) ([]namedValue, string) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, ""
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, string(raw)
	}
	out := make([]namedValue, 0, len(m))
	for name, v := range m {
		s, ok := v.(string)
		if !ok {
			b, _ := json.Marshal(v)
			s = string(b)
		}
		out = append(out, namedValue{Name: name, Value: s})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, ""
}

// age says how long d is, in its two largest units without a zero one: "45s", "26m",
// "1m30s", "5h", "5h4m", "3d", "3d2h".
func age(d time.Duration) string {
	d = d.Truncate(time.Second)
	two := func(a time.Duration, ua string, b time.Duration, ub string) string {
		if b == 0 {
			return fmt.Sprintf("%d%s", a, ua)
		}
		return fmt.Sprintf("%d%s%d%s", a, ua, b, ub)
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", d/time.Second)
	case d < time.Hour:
		return two(d/time.Minute, "m", d%time.Minute/time.Second, "s")
	case d < 24*time.Hour:
		return two(d/time.Hour, "h", d%time.Hour/time.Minute, "m")
	}
	return two(d/(24*time.Hour), "d", d%(24*time.Hour)/time.Hour, "h")
}

// Ago says when t was from now, rounded down to its two largest units without a zero
// one: "12s ago", "26m ago", "2h5m ago", "3d ago", "in 5s", or "just now". It is how the
// console and the extworker command print an age.
func Ago(now, t time.Time) string { return ago(now, t) }

// ago is Ago.
func ago(now, t time.Time) string {
	switch d := now.Sub(t); {
	case d >= time.Second:
		return age(d) + " ago"
	case d <= -time.Second:
		return "in " + age(-d)
	}
	return "just now"
}

// stamp shows t as absolute UTC with how long ago it was.
func stamp(now, t time.Time) template.HTML {
	u := t.UTC()
	return template.HTML(fmt.Sprintf(`<time datetime="%s">%s</time> (%s)`, //nolint:gosec // formatted times only
		u.Format(time.RFC3339), u.Format("2006-01-02 15:04:05 UTC"), ago(now, t)))
}

// stampp is stamp of a time that may be missing ("-").
func stampp(now time.Time, t *time.Time) template.HTML {
	if t == nil {
		return "-"
	}
	return stamp(now, *t)
}
