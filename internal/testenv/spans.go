package testenv

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Spans records the spans of a test in memory (RecordSpans).
type Spans struct {
	exp *tracetest.InMemoryExporter
}

// RecordSpans installs, for the rest of the test, an OpenTelemetry SDK TracerProvider
// that records every span as it ends, and the W3C trace context propagator, as the
// global ones (what package extworker installs when traces are on); the previous ones
// are back at cleanup. They are global: a test that records spans must not call
// t.Parallel, and should pick out its own spans (by a topic or a trace of its own), as
// other tests' spans may be recorded too.
func RecordSpans(t testing.TB) *Spans {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		_ = tp.Shutdown(context.Background())
	})
	return &Spans{exp: exp}
}

// Ended returns the spans ended so far.
func (s *Spans) Ended() tracetest.SpanStubs { return s.exp.GetSpans() }

// Trace returns the ended spans of the trace of the first ended span named name for
// which match (nil: any) is true, as SpanNodes, and whether there is one.
func (s *Spans) Trace(name string, match func(tracetest.SpanStub) bool) ([]SpanNode, bool) {
	all := s.Ended()
	for _, sp := range all {
		if sp.Name != name || (match != nil && !match(sp)) {
			continue
		}
		var nodes []SpanNode
		for _, o := range all {
			if o.SpanContext.TraceID() == sp.SpanContext.TraceID() {
				nodes = append(nodes, NodeOf(o))
			}
		}
		return nodes, true
	}
	return nil, false
}

// SpanNode is a span as the tests check it, from the SDK (NodeOf) or a collector's API.
type SpanNode struct {
	ID, Parent, Name string
	Start            time.Time
	// Attrs are the span's attributes, values as text.
	Attrs map[string]string
	// Status is "Error" or "" (unset or ok); StatusDescription the error's.
	Status, StatusDescription string
	// Events are the span's events' names and attributes, as text.
	Events []string
}

// NodeOf converts a recorded span.
func NodeOf(sp tracetest.SpanStub) SpanNode {
	n := SpanNode{ID: sp.SpanContext.SpanID().String(), Name: sp.Name, Start: sp.StartTime, Attrs: map[string]string{},
		StatusDescription: sp.Status.Description}
	if sp.Parent.IsValid() {
		n.Parent = sp.Parent.SpanID().String()
	}
	if sp.Status.Code == codes.Error {
		n.Status = "Error"
	}
	for _, a := range sp.Attributes {
		n.Attrs[string(a.Key)] = a.Value.Emit()
	}
	for _, e := range sp.Events {
		text := e.Name
		for _, a := range e.Attributes {
			text += " " + string(a.Key) + "=" + a.Value.Emit()
		}
		n.Events = append(n.Events, text)
	}
	return n
}

// Children returns the nodes whose parent is id, by start time.
func Children(nodes []SpanNode, id string) []SpanNode {
	var out []SpanNode
	for _, n := range nodes {
		if n.Parent == id {
			out = append(out, n)
		}
	}
	slices.SortStableFunc(out, func(a, b SpanNode) int { return a.Start.Compare(b.Start) })
	return out
}

// Names returns the nodes' names.
func Names(nodes []SpanNode) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.Name
	}
	return out
}

// SpanTree renders the nodes as an indented tree of names (with the status of failed
// spans), roots first, children by start time: for a test's log.
func SpanTree(nodes []SpanNode) string {
	ids := map[string]bool{}
	for _, n := range nodes {
		ids[n.ID] = true
	}
	var b strings.Builder
	var walk func(n SpanNode, depth int)
	walk = func(n SpanNode, depth int) {
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), n.Name)
		if n.Status == "Error" {
			fmt.Fprintf(&b, " [Error: %s]", n.StatusDescription)
		}
		b.WriteByte('\n')
		for _, c := range Children(nodes, n.ID) {
			walk(c, depth+1)
		}
	}
	var roots []SpanNode
	for _, n := range nodes {
		if n.Parent == "" || !ids[n.Parent] {
			roots = append(roots, n)
		}
	}
	slices.SortStableFunc(roots, func(a, b SpanNode) int { return a.Start.Compare(b.Start) })
	for _, r := range roots {
		walk(r, 0)
	}
	return b.String()
}

// SpanLeaks returns where a secret (a business key, an intent key, a variable's value)
// shows in the spans: a name, an attribute's key or value, a status description or an
// event. Secrets are compared case-insensitively.
func SpanLeaks(nodes []SpanNode, secrets ...string) []string {
	var leaks []string
	check := func(where, text string) {
		for _, s := range secrets {
			if s != "" && strings.Contains(strings.ToLower(text), strings.ToLower(s)) {
				leaks = append(leaks, fmt.Sprintf("%s: %q contains %q", where, text, s))
			}
		}
	}
	for _, n := range nodes {
		check("span name", n.Name)
		check(n.Name+" status", n.StatusDescription)
		for k, v := range n.Attrs {
			check(n.Name+" attribute", k+"="+v)
		}
		for _, e := range n.Events {
			check(n.Name+" event", e)
		}
	}
	return leaks
}
