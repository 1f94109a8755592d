package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// Issue 12, defect 3: attempts that ended cleanly as not sent (a 429, connection
// refused) are not attempts that "took the intent without an outcome": however many
// there are, the intent is never held for them, and is sent once the provider takes it.
// Two tiers: the shipped MaxAttempts (10, refused 12 times) and a short one (2, refused 5
// times).
func TestNotSentAttemptsDoNotExhaustMaxAttempts(t *testing.T) {
	for _, tier := range []struct {
		name     string
		cfg      idempotency.Config
		refusals int
	}{
		{"defaults", idempotency.Config{}, 12},
		{"short", idempotency.Config{MaxAttempts: 2}, 5},
	} {
		t.Run(tier.name, func(t *testing.T) {
			t.Parallel()
			l, pool := newLedger(t, tier.cfg)
			p := newProvider()
			ctx := testenv.Context(t, time.Minute)
			in := intent("NS-1", 100)
			refusals := tier.refusals
			eff := p.effect()
			eff.Dispatch = func(ctx context.Context, key string) (idempotency.Result, error) {
				if refusals > 0 {
					refusals--
					return idempotency.Result{}, idempotency.NotSent(errors.New("429 rate limited"))
				}
				return p.charge(ctx, key)
			}
			for i := 0; i < tier.refusals; i++ {
				_, err := l.Do(ctx, in, eff)
				require.Error(t, err)
				assert.Equal(t, failure.KindRetryable, kind(err), "attempt %d: not sent is retried, never held", i+1)
				assert.Equal(t, idempotency.StatePrepared, state(t, pool, l, in))
			}
			out, err := l.Do(ctx, in, eff)
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateConfirmed, out.State)
			r, err := l.Operations().Get(ctx, in.Scope, in.Key)
			require.NoError(t, err)
			assert.Zero(t, r.AbandonedAttempts)
			assert.Equal(t, tier.refusals+1, r.Attempt)
		})
	}
}

// operators returns ledgers on the namespace of l as the two operator logins make up
// creates: two people, each with a database user of their own, registered as alice and
// bob; cfg.ApprovalThreshold is recorded for the namespace, as extworker migrate does.
func operators(t *testing.T, l *idempotency.Ledger, cfg idempotency.Config) (alice, bob *idempotency.Ledger) {
	t.Helper()
	cfg.Namespace = l.Namespace()
	owner := testenv.DB(t)
	testenv.RegisterOperators(t, owner)
	require.NoError(t, idempotency.SetApprovalThreshold(context.Background(), owner, cfg.Namespace, cfg.ApprovalThreshold))
	open := func(login string) *idempotency.Ledger {
		ol, err := idempotency.New(testenv.DBAs(t, login), cfg)
		require.NoError(t, err)
		return ol
	}
	return open(testenv.AliceLogin), open(testenv.BobLogin)
}

// held drives in into operator hold: the dispatch is ambiguous, and the effect has no
// way to reconcile it.
func held(t *testing.T, l *idempotency.Ledger, in idempotency.Intent) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		return idempotency.Result{}, errors.New("connection reset after the request was written")
	}}
	_, err := l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	_, err = l.Do(ctx, in, eff)
	require.Equal(t, failure.KindUnknownOutcome, kind(err))
	r, err := l.Operations().Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	require.Equal(t, idempotency.StateOperatorHold, r.State)
}

// The two-person rule, with two operator identities: a confirmation of a held charge is
// recorded pending and changes nothing; its requester cannot approve it (by database user,
// nor by another login under the same name); a rejection by the other operator leaves the
// intent untouched; an approval by the other operator applies it; both people, their
// database users, times and reasons are in the event trail.
func TestTwoPersonRule(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{})
	alice, bob := operators(t, l, idempotency.Config{ApprovalThreshold: 5000})
	ctx := testenv.Context(t, time.Minute)
	in := intent("TP-1", 25000)
	in.Amount = 25000 // above the threshold
	held(t, l, in)
	before, err := l.Operations().Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)

	confirm := idempotency.Resolution{As: idempotency.StateConfirmed, ProviderRef: "ch_manual", Values: map[string]any{"paymentRef": "ch_manual"},
		Reason: "dashboard shows ch_manual", Operator: "alice"}
	res, err := alice.Operations().Resolve(ctx, in.Scope, in.Key, confirm)
	require.NoError(t, err)
	require.NotNil(t, res.Pending, "a confirmation above the threshold waits for a second operator")
	assert.Equal(t, idempotency.StateOperatorHold, res.Row.State)
	assert.Equal(t, testenv.AliceLogin, res.Pending.RequestedDBUser)
	_, err = alice.Operations().Resolve(ctx, in.Scope, in.Key, confirm)
	assert.ErrorContains(t, err, "already pending", "one pending resolution per intent")

	_, err = alice.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "alice", Reason: "looks right to me"})
	assert.ErrorIs(t, err, idempotency.ErrSelfApproval, "nobody approves their own")
	_, err = alice.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "carol", Reason: "another name, same login"})
	assert.ErrorIs(t, err, idempotency.ErrOperatorIdentity, "a login acts under its person's name only")
	_, err = alice.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Reason: "no name given: the login's person"})
	assert.ErrorIs(t, err, idempotency.ErrSelfApproval)
	_, err = bob.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "Alice", Reason: "another login, the requester's name"})
	assert.ErrorIs(t, err, idempotency.ErrOperatorIdentity)

	rejected, err := bob.Operations().RejectResolution(ctx, res.Pending.ID, idempotency.Decision{Operator: "bob", Reason: "ch_manual belongs to another invoice"})
	require.NoError(t, err)
	assert.Equal(t, idempotency.ResolutionRejected, rejected.Status)
	after, err := l.Operations().Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	assert.Equal(t, before.State, after.State, "rejection leaves the intent untouched")
	assert.Equal(t, before.ProviderRef, after.ProviderRef)
	assert.Equal(t, before.Attempt, after.Attempt)
	_, err = bob.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "bob", Reason: "changed my mind"})
	assert.ErrorIs(t, err, idempotency.ErrNotPending)

	confirm.ProviderRef, confirm.Values = "ch_right", map[string]any{"paymentRef": "ch_right"}
	res, err = alice.Operations().Resolve(ctx, in.Scope, in.Key, confirm)
	require.NoError(t, err)
	require.NotNil(t, res.Pending)
	approved, err := bob.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "bob", Reason: "checked ch_right in the dashboard"})
	require.NoError(t, err)
	assert.Nil(t, approved.Pending)
	assert.Equal(t, idempotency.StateConfirmed, approved.Row.State, "approval by another operator applies it")
	assert.Equal(t, "ch_right", *approved.Row.ProviderRef)

	out, err := l.Do(ctx, in, idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		t.Error("a resolved intent is not sent")
		return idempotency.Result{}, nil
	}})
	require.NoError(t, err)
	assert.Equal(t, "ch_right", out.Values["paymentRef"], "the task completes from the ledger")

	req, err := l.Operations().Resolution(ctx, res.Pending.ID)
	require.NoError(t, err)
	assert.Equal(t, idempotency.ResolutionApproved, req.Status)
	assert.Equal(t, "bob", *req.DecidedBy)
	assert.Equal(t, testenv.BobLogin, *req.DecidedDBUser)
	events, err := l.Operations().Events(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	var trail []string
	for _, e := range events {
		trail = append(trail, e.Actor+" ["+e.DBUser+"] "+e.Reason)
	}
	all := strings.Join(trail, "\n")
	assert.Contains(t, all, "operator:alice ["+testenv.AliceLogin+"] resolution #")
	assert.Contains(t, all, "rejected by bob (database user "+testenv.BobLogin+"): ch_manual belongs to another invoice")
	assert.Contains(t, all, "operator:bob ["+testenv.BobLogin+"] operator resolution #")
	assert.Contains(t, all, "requested by alice (database user "+testenv.AliceLogin+")")
	assert.Contains(t, all, "approved by bob (database user "+testenv.BobLogin+"): checked ch_right in the dashboard")
}

// The console's login (a member of extworker_console) serves every operator the console
// authenticates: on it, the ledger takes the person the console names, who must be
// registered, so bob approves alice's request through the same login, while alice (under
// any capitalisation) still cannot approve her own. A person is one person across the
// console and the CLI (issue 23, item 2): alice requests in the console and cannot
// approve with her own login, whatever name she gives; nor the reverse.
func TestTwoPersonRuleConsoleLogin(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{})
	cfg := idempotency.Config{Namespace: l.Namespace()}
	console, err := idempotency.New(testenv.DBAs(t, testenv.ConsoleLogin), cfg)
	require.NoError(t, err)
	alice, bob := operators(t, l, cfg)
	ctx := testenv.Context(t, time.Minute)

	in := intent("CL-1", 25000)
	held(t, l, in)
	confirm := idempotency.Resolution{As: idempotency.StateConfirmed, ProviderRef: "ch_console", Reason: "dashboard shows ch_console", Operator: "alice"}
	res, err := console.Operations().Resolve(ctx, in.Scope, in.Key, confirm)
	require.NoError(t, err)
	require.NotNil(t, res.Pending)
	assert.Equal(t, testenv.ConsoleLogin, res.Pending.RequestedDBUser)
	_, err = console.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "ALICE", Reason: "mine, but approved anyway"})
	assert.ErrorIs(t, err, idempotency.ErrSelfApproval, "the console names the person")
	_, err = console.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "mallory", Reason: "a name nobody registered"})
	assert.ErrorIs(t, err, idempotency.ErrOperatorIdentity, "the console names registered operators only")
	_, err = alice.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "carol", Reason: "console request, CLI approval under another name"})
	assert.ErrorIs(t, err, idempotency.ErrOperatorIdentity)
	_, err = alice.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Reason: "console request, CLI approval on her own login"})
	assert.ErrorIs(t, err, idempotency.ErrSelfApproval, "alice in the console is alice on her login")
	approved, err := console.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "bob", Reason: "checked ch_console"})
	require.NoError(t, err, "another registered person on the console's login is a second person")
	assert.Equal(t, idempotency.StateConfirmed, approved.Row.State)
	req, err := l.Operations().Resolution(ctx, res.Pending.ID)
	require.NoError(t, err)
	assert.Equal(t, testenv.ConsoleLogin, *req.DecidedDBUser)
	assert.Equal(t, testenv.Bob, *req.DecidedBy)

	// The reverse: requested with alice's login, approved in the console.
	in = intent("CL-2", 25000)
	held(t, l, in)
	res, err = alice.Operations().Resolve(ctx, in.Scope, in.Key, idempotency.Resolution{As: idempotency.StateConfirmed, ProviderRef: "ch_cli", Reason: "seen"})
	require.NoError(t, err)
	require.NotNil(t, res.Pending)
	assert.Equal(t, testenv.Alice, res.Pending.RequestedBy, "the login's person, not a name typed in")
	_, err = console.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "alice", Reason: "CLI request, console approval"})
	assert.ErrorIs(t, err, idempotency.ErrSelfApproval)
	_, err = alice.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "bob", Reason: "another name, alice's login"})
	assert.ErrorIs(t, err, idempotency.ErrOperatorIdentity, "a login acts as its person only")
	approved, err = console.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "carol", Reason: "carol, console only"})
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, approved.Row.State)
	_ = bob
}

// Under the threshold one operator resolves; a rejection never needs a second one; an
// orphaned intent always does, whatever the verdict.
func TestApprovalNeeded(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{ApprovalThreshold: 5000})
	alice, bob := operators(t, l, idempotency.Config{ApprovalThreshold: 5000})
	alicePreview, _ := alice.Operations().ApprovalNeeded(idempotency.Row{Amount: new(int64(1000))}, idempotency.StateConfirmed)
	assert.False(t, alicePreview, "the preview agrees with the database's threshold")
	ctx := testenv.Context(t, time.Minute)

	small := intent("AN-1", 1000)
	small.Amount = 1000
	held(t, l, small)
	res, err := alice.Operations().Resolve(ctx, small.Scope, small.Key, idempotency.Resolution{As: idempotency.StateConfirmed, ProviderRef: "ch_1",
		Reason: "found", Operator: "alice"})
	require.NoError(t, err)
	assert.Nil(t, res.Pending)
	assert.Equal(t, idempotency.StateConfirmed, res.Row.State)

	unknownAmount := intent("AN-2", 1000)
	held(t, l, unknownAmount)
	res, err = alice.Operations().Resolve(ctx, unknownAmount.Scope, unknownAmount.Key, idempotency.Resolution{As: idempotency.StateRejected,
		Reason: "the provider never got it", Operator: "alice"})
	require.NoError(t, err)
	assert.Nil(t, res.Pending, "declaring money not moved is one operator's call")
	assert.Equal(t, idempotency.StateRejected, res.Row.State)

	orphan := intent("AN-3", 1000)
	orphan.Amount = 1000
	held(t, l, orphan)
	_, err = pool.Exec(ctx, `UPDATE extworker_intents SET orphaned_at = now(), orphan_reason = 'instance deleted' WHERE namespace = $1 AND intent_key = $2`,
		l.Namespace(), orphan.Key)
	require.NoError(t, err)
	res, err = alice.Operations().Resolve(ctx, orphan.Scope, orphan.Key, idempotency.Resolution{As: idempotency.StateRejected,
		Reason: "refund issued by hand", Operator: "alice"})
	require.NoError(t, err)
	require.NotNil(t, res.Pending, "every verdict on an orphan needs a second operator")
	_, err = bob.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "bob", Reason: "refund seen"})
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateRejected, state(t, pool, l, orphan))
}

// Issue 12, defect 3: an intent held after attempts that never reached the provider has
// a way out: the retry verdict (approved by a second operator) sends it back to prepared
// with its counters at zero, and the next attempt sends it, with the same provider key.
func TestRetryVerdictSendsTheIntentAgain(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{})
	alice, bob := operators(t, l, idempotency.Config{})
	ctx := testenv.Context(t, time.Minute)
	in := intent("RV-1", 700)
	held(t, l, in)
	res, err := alice.Operations().Resolve(ctx, in.Scope, in.Key, idempotency.Resolution{As: idempotency.StatePrepared,
		Reason: "the provider has no record of the key", Operator: "alice"})
	require.NoError(t, err)
	require.NotNil(t, res.Pending, "sending money again needs a second operator")
	res, err = bob.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "bob", Reason: "confirmed no record"})
	require.NoError(t, err)
	assert.Equal(t, idempotency.StatePrepared, res.Row.State)
	assert.Zero(t, res.Row.AbandonedAttempts)
	assert.Zero(t, res.Row.Reconciliations)

	p := newProvider()
	out, err := l.Do(ctx, in, p.effect())
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, out.State)
	assert.Equal(t, idempotency.ProviderKey(l.Namespace(), in.Scope, in.Key), out.ProviderKey)
	calls, effects := p.stats()
	assert.Equal(t, 1, calls)
	assert.Equal(t, 1, effects)
	assert.Equal(t, idempotency.StateConfirmed, state(t, pool, l, in))
}

// An approval of an intent that moved since the request (a worker reconciled it) is not
// applied: the resolution goes stale.
func TestStaleResolutionIsNotApplied(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{})
	alice, bob := operators(t, l, idempotency.Config{})
	ctx := testenv.Context(t, time.Minute)
	in := intent("ST-1", 700)
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		return idempotency.Result{}, errors.New("timeout after the request was written")
	}}
	_, err := l.Do(ctx, in, eff) // unknown: an operator may resolve it, a worker may reconcile it
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	res, err := alice.Operations().Resolve(ctx, in.Scope, in.Key, idempotency.Resolution{As: idempotency.StateConfirmed, ProviderRef: "ch_x",
		Reason: "probably went through", Operator: "alice"})
	require.NoError(t, err)
	require.NotNil(t, res.Pending)
	eff.Reconcile = func(context.Context, idempotency.Query) (idempotency.Reconciliation, error) {
		return idempotency.Found(idempotency.Result{ProviderRef: "ch_real"}), nil
	}
	_, err = l.Do(ctx, in, eff)
	require.NoError(t, err)
	_, err = bob.Operations().Approve(ctx, res.Pending.ID, idempotency.Decision{Operator: "bob", Reason: "ok"})
	assert.ErrorIs(t, err, idempotency.ErrStaleResolution)
	r, err := l.Operations().Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateReconciled, r.State)
	assert.Equal(t, "ch_real", *r.ProviderRef)
	req, err := l.Operations().Resolution(ctx, res.Pending.ID)
	require.NoError(t, err)
	assert.Equal(t, idempotency.ResolutionStale, req.Status)
	_ = pool
}

// The worker's database role runs the ledger (record, dispatch, confirm, prune through
// extworker_prune) but cannot settle an intent held for an operator.
func TestWorkerRoleCannotResolve(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{})
	worker, err := idempotency.New(testenv.DBAs(t, testenv.WorkerLogin), idempotency.Config{Namespace: l.Namespace()})
	require.NoError(t, err)
	ctx := testenv.Context(t, time.Minute)
	p := newProvider()
	out, err := worker.Do(ctx, intent("WR-1", 100), p.effect())
	require.NoError(t, err, "the worker role's grants are enough to run effects")
	assert.Equal(t, idempotency.StateConfirmed, out.State)
	_, err = worker.Operations().Prune(ctx, idempotency.MinRetention(24*time.Hour))
	require.NoError(t, err, "the worker role prunes through extworker_prune")

	in := intent("WR-2", 100)
	in.Amount = 1
	held(t, worker, in)
	wl, err := idempotency.New(testenv.DBAs(t, testenv.WorkerLogin), idempotency.Config{Namespace: l.Namespace(), ApprovalThreshold: 100})
	require.NoError(t, err)
	_, err = wl.Operations().Resolve(ctx, in.Scope, in.Key, idempotency.Resolution{As: idempotency.StateConfirmed, ProviderRef: "ch_forged",
		Reason: "trust me", Operator: "mallory"})
	assert.ErrorContains(t, err, "permission denied for function extworker_resolve")
	in.Amount = 0
	in2 := intent("WR-3", 100)
	held(t, worker, in2)
	_, err = wl.Operations().Resolve(ctx, in2.Scope, in2.Key, idempotency.Resolution{As: idempotency.StateConfirmed, ProviderRef: "ch_forged",
		Reason: "trust me", Operator: "mallory"})
	assert.ErrorContains(t, err, "permission denied", "nor record a resolution for a second operator")
}

// backdate moves an intent's last change into the past, as if it had settled then.
func backdate(t *testing.T, pool *pgxpool.Pool, l *idempotency.Ledger, key string, ago time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `UPDATE extworker_intents SET updated_at = now() - $3::bigint * interval '1 microsecond'
		WHERE namespace = $1 AND intent_key = $2`, l.Namespace(), key, ago.Microseconds())
	require.NoError(t, err)
}

// Issue 12, defect 4: prune keeps the evidence. A retention under the provider's key
// window plus a day is refused; orphaned and unsettled intents are never pruned; a pruned
// intent leaves a tombstone that refuses to dispatch it again (nothing sent, an incident
// naming the charge), and its events stay.
func TestPruneKeepsTheEvidence(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{ProviderWindow: 24 * time.Hour})
	ctx := testenv.Context(t, time.Minute)
	p := newProvider()
	charged, orphan, doubt := intent("PR-1", 100), intent("PR-2", 100), intent("PR-3", 100)
	_, err := l.Do(ctx, charged, p.effect())
	require.NoError(t, err)
	_, err = l.Do(ctx, orphan, p.effect())
	require.NoError(t, err)
	_, err = l.Operations().MarkOrphaned(ctx, "", "task-PR-2", "instance deleted")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE extworker_intents SET orphaned_at = now(), orphan_reason = 'instance deleted' WHERE namespace = $1 AND intent_key = $2`,
		l.Namespace(), orphan.Key)
	require.NoError(t, err)
	p.drop = true
	_, err = l.Do(ctx, doubt, p.effect())
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	for _, in := range []idempotency.Intent{charged, orphan, doubt} {
		backdate(t, pool, l, in.Key, 72*time.Hour)
	}

	for _, retention := range []time.Duration{0, time.Hour, 24 * time.Hour, 47 * time.Hour} {
		_, err := l.Operations().Prune(ctx, retention)
		assert.ErrorIs(t, err, idempotency.ErrRetentionTooShort, "retention %v", retention)
	}
	_, err = pool.Exec(ctx, `SELECT extworker_prune($1, interval '1 hour', 10)`, l.Namespace())
	assert.ErrorContains(t, err, "under a day", "the database refuses a short retention too")

	n, err := l.Operations().Prune(ctx, idempotency.MinRetention(24*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "only the settled, not orphaned intent")
	_, err = l.Operations().Get(ctx, charged.Scope, charged.Key)
	require.ErrorIs(t, err, idempotency.ErrNotFound)
	assert.Equal(t, idempotency.StateConfirmed, state(t, pool, l, orphan))
	assert.Equal(t, idempotency.StateUnknown, state(t, pool, l, doubt))

	tomb, err := l.Operations().Tombstone(ctx, charged.Scope, charged.Key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, tomb.State)
	require.NotNil(t, tomb.ProviderRef)
	events, err := l.Operations().Events(ctx, charged.Scope, charged.Key)
	require.NoError(t, err)
	assert.NotEmpty(t, events, "the events of a pruned intent stay")

	callsBefore, _ := p.stats()
	_, err = l.Do(ctx, charged, p.effect()) // the incident fixed weeks later: the task runs again
	assert.ErrorIs(t, err, idempotency.ErrPruned)
	assert.Equal(t, failure.KindPermanent, kind(err))
	assert.Contains(t, err.Error(), *tomb.ProviderRef)
	callsAfter, _ := p.stats()
	assert.Equal(t, callsBefore, callsAfter, "a pruned intent is never dispatched again")
}

// Prune works in batches: more settled intents than one batch are all pruned, each into
// a tombstone.
func TestPruneInBatches(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{})
	ctx := testenv.Context(t, time.Minute)
	const n = 2500
	_, err := pool.Exec(ctx, `INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state, updated_at)
		SELECT $1, 'payment.collect', 'bulk:' || i, 'd', 'ew_' || i, 'confirmed', now() - interval '30 days' FROM generate_series(1, $2) i`,
		l.Namespace(), n)
	require.NoError(t, err)
	pruned, err := l.Operations().Prune(ctx, idempotency.MinRetention(24*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, int64(n), pruned)
	var tombs int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM extworker_intent_tombstones WHERE namespace = $1`, l.Namespace()).Scan(&tombs))
	assert.Equal(t, n, tombs)
}

// Issue 12, defect 5: compensation as the seed describes it. A refund names the charge it
// undoes; it has its own key, digest and lifecycle; when it confirms, the charge becomes
// compensated in the same transaction (never dispatched again), and each shows the other.
func TestCompensatingIntentMarksTheOriginalCompensated(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{})
	ctx := testenv.Context(t, time.Minute)
	p := newProvider()
	charge := intent("CP-1", 900)
	_, err := l.Do(ctx, charge, p.effect())
	require.NoError(t, err)

	refund := idempotency.Intent{Scope: "payment.refund", Key: "invoice:CP-1:refund:v1", Request: map[string]any{"invoice": "CP-1", "amount": 900},
		Compensates: idempotency.IntentRef{Scope: charge.Scope, Key: charge.Key}, Task: idempotency.TaskRef{Actor: "test-worker", TaskID: "task-refund"}}
	refunds := 0
	refundEff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		refunds++
		return idempotency.Result{ProviderRef: "re_1"}, nil
	}}
	out, err := l.Do(ctx, refund, refundEff)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, out.State)
	assert.Equal(t, idempotency.StateCompensated, state(t, pool, l, charge), "the charge is compensated with the refund's confirmation")

	_, err = l.Do(ctx, charge, p.effect())
	assert.ErrorIs(t, err, idempotency.ErrCompensated)
	_, err = l.Do(ctx, refund, refundEff)
	require.NoError(t, err, "the refund replays")
	assert.Equal(t, 1, refunds)

	cr, err := l.Operations().Get(ctx, charge.Scope, charge.Key)
	require.NoError(t, err)
	rr, err := l.Operations().Get(ctx, refund.Scope, refund.Key)
	require.NoError(t, err)
	assert.NotEqual(t, cr.ProviderKey, rr.ProviderKey, "the refund has its own key")
	assert.NotEqual(t, cr.Digest, rr.Digest)
	compensates, by, err := l.Operations().Compensation(ctx, rr)
	require.NoError(t, err)
	require.NotNil(t, compensates)
	assert.Equal(t, charge.Key, compensates.Key)
	assert.Empty(t, by)
	_, by, err = l.Operations().Compensation(ctx, cr)
	require.NoError(t, err)
	require.Len(t, by, 1)
	assert.Equal(t, refund.Key, by[0].Key)
	events, err := l.Operations().Events(ctx, charge.Scope, charge.Key)
	require.NoError(t, err)
	assert.Contains(t, events[len(events)-1].Reason, "compensated by payment.refund/invoice:CP-1:refund:v1 (provider ref re_1)")

	// Nothing to compensate: not recorded, or not confirmed.
	ghost := refund
	ghost.Key, ghost.Compensates.Key = "invoice:none:refund:v1", "invoice:none:v1"
	_, err = l.Do(ctx, ghost, refundEff)
	assert.ErrorIs(t, err, idempotency.ErrNothingToCompensate)
	doubt := intent("CP-2", 100)
	p.drop = true
	_, err = l.Do(ctx, doubt, p.effect())
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	early := refund
	early.Key, early.Compensates.Key = "invoice:CP-2:refund:v1", doubt.Key
	_, err = l.Do(ctx, early, refundEff)
	assert.ErrorIs(t, err, idempotency.ErrNothingToCompensate, "an unknown charge is reconciled or resolved first")
	assert.Equal(t, 1, refunds, "nothing sent for either")

	// The refund pruned before the charge it compensated: the charge is not refunded again.
	_, err = pool.Exec(ctx, `DELETE FROM extworker_intents WHERE id = $1`, rr.ID)
	require.NoError(t, err)
	second := refund
	second.Key = "invoice:CP-1:refund:v2"
	_, err = l.Do(ctx, second, refundEff)
	assert.ErrorIs(t, err, idempotency.ErrCompensationExists)
	assert.Equal(t, 1, refunds, "nothing sent")
}
