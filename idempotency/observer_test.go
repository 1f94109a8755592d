package idempotency_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// recordingObserver keeps what the ledger reported, as "kind scope detail" lines.
type recordingObserver struct {
	mu     sync.Mutex
	events []string
}

func (r *recordingObserver) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, s)
}
func (r *recordingObserver) Transition(scope string, from, to idempotency.State) {
	r.add("transition " + scope + " " + string(from) + ">" + string(to))
}
func (r *recordingObserver) DuplicateSuppressed(scope, reason string) {
	r.add("duplicate " + scope + " " + reason)
}
func (r *recordingObserver) Reconciled(scope, result string) {
	r.add("reconciled " + scope + " " + result)
}
func (r *recordingObserver) DigestMismatch(scope string) { r.add("conflict " + scope) }
func (r *recordingObserver) DatabaseError(op string, _ error) {
	r.add("dberror " + op)
}
func (r *recordingObserver) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

// The observer sees committed transitions, replays, reconciliations and conflicts; the
// annotate hook gets the intent and its final state; the backlog counts unknown intents.
func TestObserverAndBacklog(t *testing.T) {
	t.Parallel()
	base, _ := newLedger(t, idempotency.Config{})
	obs := &recordingObserver{}
	var annotated []slog.Attr
	var logs strings.Builder
	taskLogger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With(slog.String("external_task_id", "task-42"))
	type ctxKey struct{}
	l := base.WithHooks(idempotency.Hooks{Observer: obs,
		ContextLogger: func(ctx context.Context) *slog.Logger {
			if lg, ok := ctx.Value(ctxKey{}).(*slog.Logger); ok {
				return lg
			}
			return nil
		},
		Annotate: func(_ context.Context, attrs ...slog.Attr) { annotated = attrs }})
	ctx := context.WithValue(testenv.Context(t, time.Minute), ctxKey{}, taskLogger)
	p := newProvider()

	_, err := l.Do(ctx, intent("OBS-1", 100), p.effect())
	require.NoError(t, err)
	assert.Equal(t, []string{"transition payment.collect >prepared", "transition payment.collect prepared>dispatched",
		"transition payment.collect dispatched>confirmed"}, obs.take())
	assert.Equal(t, `[idempotency_scope=payment.collect idempotency_key=invoice:OBS-1:v1 ledger_state=confirmed]`, attrsString(annotated))
	assert.Contains(t, logs.String(), `"external_task_id":"task-42"`, "the ledger logs through the task's logger")
	assert.Contains(t, logs.String(), `"idempotency_key":"invoice:OBS-1:v1","ledger_state":"confirmed"`)

	_, err = l.Do(ctx, intent("OBS-1", 100), p.effect())
	require.NoError(t, err)
	assert.Equal(t, []string{"duplicate payment.collect replayed"}, obs.take())

	_, err = l.Do(ctx, intent("OBS-1", 999), p.effect())
	require.ErrorIs(t, err, idempotency.ErrDigestMismatch)
	assert.Equal(t, []string{"conflict payment.collect"}, obs.take())

	// An ambiguous dispatch leaves the intent unknown: the backlog counts it.
	p.lose = true
	_, err = l.Do(ctx, intent("OBS-2", 200), p.effect())
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	assert.Equal(t, "transition payment.collect dispatched>unknown", obs.take()[2:][0])
	rows, err := l.Operations().Backlog(ctx)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	assert.Equal(t, idempotency.BacklogRow{Scope: "payment.collect", State: idempotency.StateUnknown, Count: 1, OldestAge: rows[0].OldestAge}, rows[0])
	assert.GreaterOrEqual(t, rows[0].OldestAge, time.Duration(0))

	// The next attempt reconciles: found.
	var out idempotency.Receipt
	testenv.Eventually(t, 10*time.Second, "the reconciling attempt to run", func() (bool, error) {
		out, err = l.Do(ctx, intent("OBS-2", 200), p.effect())
		return !errors.Is(err, idempotency.ErrInProgress), nil
	})
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateReconciled, out.State)
	assert.Contains(t, obs.take(), "reconciled payment.collect found")
	rows, err = l.Operations().Backlog(ctx)
	require.NoError(t, err)
	assert.Empty(t, rows)
}

func attrsString(attrs []slog.Attr) string {
	parts := make([]string, len(attrs))
	for i, a := range attrs {
		parts[i] = a.String()
	}
	return "[" + strings.Join(parts, " ") + "]"
}
