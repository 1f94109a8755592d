package daemon

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/extworker/extworker/internal/termsafe"
)

// termsafeHandler passes records to a text handler (tint's) with every string it did not
// write itself escaped (package termsafe): messages, attribute keys, string values, error
// texts and whatever else prints as text. Values come from process data (a business key,
// an idempotency key, an engine's error message): on a terminal, an escape sequence in
// one would recolour or rewrite the operator's screen, and a newline would forge a log
// line. JSON logs escape them already.
type termsafeHandler struct{ next slog.Handler }

func (h termsafeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h termsafeHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, termsafe.String(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(safeAttr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h termsafeHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	safe := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		safe[i] = safeAttr(a)
	}
	return termsafeHandler{h.next.WithAttrs(safe)}
}

func (h termsafeHandler) WithGroup(name string) slog.Handler {
	return termsafeHandler{h.next.WithGroup(termsafe.Value(name))}
}

// safeAttr escapes an attribute's key and its value's text.
func safeAttr(a slog.Attr) slog.Attr {
	a.Key = termsafe.Value(a.Key)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		v = slog.StringValue(termsafe.Value(v.String()))
	case slog.KindGroup:
		group := v.Group()
		safe := make([]any, len(group))
		for i, g := range group {
			safe[i] = safeAttr(g)
		}
		return slog.Group(a.Key, safe...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			v = slog.AnyValue(safeError{x}) // still an error: tint marks it as one
		case nil:
		default:
			v = slog.StringValue(termsafe.Value(fmt.Sprint(x)))
		}
	}
	a.Value = v
	return a
}

// safeError is an error whose text is escaped; errors.Is and errors.As see the original.
type safeError struct{ err error }

func (e safeError) Error() string { return termsafe.Value(e.err.Error()) }
func (e safeError) Unwrap() error { return e.err }
