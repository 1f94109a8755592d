package console_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// TestHostileOperator (issue 23): one person, alice, with her own database login and her
// console account, tries every way she has to move money alone on a held payment: approve
// her own console request in the console (with a forged operator field too), on her login
// (under her name and under bob's), with plain SQL on her login (settle the intent, forge
// a resolution, decide with neither approval nor rejection), request on her login and
// approve in the console, and replay her session after logging out. Each is refused and
// the payment stays held; then bob approves in the console and it is confirmed.
func TestHostileOperator(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, 2*time.Minute)
	const scope = "payment.collect"
	hold(t, e.worker, scope, "invoice:H1", "task-H1")
	hold(t, e.worker, scope, "invoice:H2", "task-H2")
	srv := newConsole(t, e, noEngine)
	aliceWeb := loggedIn(t, srv.URL, "alice")
	aliceDB := testenv.DBAs(t, testenv.AliceLogin)
	aliceCLI, err := idempotency.NewOperations(aliceDB, idempotency.Config{Namespace: e.worker.Namespace()})
	require.NoError(t, err)
	stillHeld := func(key, how string) {
		t.Helper()
		r, err := e.worker.Operations().Get(ctx, scope, key)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateOperatorHold, r.State, "after %s", how)
	}
	pending := func(key string) int64 {
		t.Helper()
		reqs, err := e.worker.Operations().Resolutions(ctx, idempotency.ResolutionFilter{Key: key, Status: idempotency.ResolutionPending})
		require.NoError(t, err)
		require.Len(t, reqs, 1)
		return reqs[0].ID
	}

	// A request in the console.
	_, body := get(t, aliceWeb, intentURL(srv.URL, scope, "invoice:H1"))
	resp, _ := post(t, aliceWeb, srv.URL+"/intent/resolve", url.Values{"csrf": {csrfOf(t, body)}, "scope": {scope}, "key": {"invoice:H1"},
		"as": {"confirmed"}, "provider_ref": {"ch_H1"}, "values": {"paymentRef=ch_H1"}, "reason": {"seen"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	id := pending("invoice:H1")
	approve := srv.URL + "/resolutions/" + itoa(id) + "/approve"

	_, body = get(t, aliceWeb, intentURL(srv.URL, scope, "invoice:H1"))
	post(t, aliceWeb, approve, url.Values{"csrf": {csrfOf(t, body)}, "reason": {"mine"}, "operator": {"bob"}, "decided_by": {"bob"}})
	stillHeld("invoice:H1", "alice approving her console request in the console, with a forged operator field")

	_, err = aliceCLI.Approve(ctx, id, idempotency.Decision{Reason: "on my own login"})
	assert.ErrorIs(t, err, idempotency.ErrSelfApproval)
	_, err = aliceCLI.Approve(ctx, id, idempotency.Decision{Operator: "bob", Reason: "as bob, on my own login"})
	assert.ErrorIs(t, err, idempotency.ErrOperatorIdentity)
	stillHeld("invoice:H1", "alice approving her console request on her own login")

	for _, stmt := range []string{
		`UPDATE extworker_intents SET state = 'confirmed', provider_ref = 'ch_forged' WHERE intent_key = 'invoice:H1'`,
		`UPDATE extworker_resolutions SET requested_by = 'bob', requested_db_user = 'extworker_bob' WHERE id = ` + itoa(id),
		`INSERT INTO extworker_resolutions (intent_id, namespace, scope, intent_key, from_state, attempt, verdict, reason, requested_by, requested_db_user)
			SELECT id, namespace, scope, intent_key, state, attempt, 'confirmed', 'x', 'bob', 'extworker_bob' FROM extworker_intents WHERE intent_key = 'invoice:H2'`,
	} {
		_, err := aliceDB.Exec(ctx, stmt)
		assert.ErrorContains(t, err, "permission denied", stmt)
	}
	_, err = aliceDB.Exec(ctx, `SELECT extworker_decide($1, $2, NULL, 'neither', NULL)`, e.worker.Namespace(), id)
	assert.Error(t, err)
	stillHeld("invoice:H1", "alice's plain SQL")

	// A request on her login, an approval in the console.
	res, err := aliceCLI.Resolve(ctx, scope, "invoice:H2", idempotency.Resolution{As: idempotency.StateConfirmed, ProviderRef: "ch_H2", Reason: "seen"})
	require.NoError(t, err)
	require.NotNil(t, res.Pending)
	_, body = get(t, aliceWeb, intentURL(srv.URL, scope, "invoice:H2"))
	post(t, aliceWeb, srv.URL+"/resolutions/"+itoa(res.Pending.ID)+"/approve", url.Values{"csrf": {csrfOf(t, body)}, "reason": {"mine too"}})
	stillHeld("invoice:H2", "alice approving her CLI request in the console")

	// Her session, replayed after she logged out.
	base, err := url.Parse(srv.URL)
	require.NoError(t, err)
	saved := aliceWeb.Jar.Cookies(base)
	_, body = get(t, aliceWeb, srv.URL+"/")
	post(t, aliceWeb, srv.URL+"/logout", url.Values{"csrf": {csrfOf(t, body)}})
	aliceWeb.Jar.SetCookies(base, saved)
	resp, _ = get(t, aliceWeb, srv.URL+"/resolutions")
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode, "the jar's old cookie is worth nothing after logout")

	// The control: a second person approves in the console.
	bob := loggedIn(t, srv.URL, "bob")
	_, body = get(t, bob, intentURL(srv.URL, scope, "invoice:H1"))
	post(t, bob, approve, url.Values{"csrf": {csrfOf(t, body)}, "reason": {"ch_H1 checked"}})
	r, err := e.worker.Operations().Get(ctx, scope, "invoice:H1")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, r.State, "bob's approval applies alice's request")
	req, err := e.worker.Operations().Resolution(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "alice", req.RequestedBy)
	assert.Equal(t, "bob", *req.DecidedBy)
}
