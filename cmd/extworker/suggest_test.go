package main

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// The incident of a held intent suggests the command that settles it; run as printed
// (split as bash does), with the verdict the operator picks, it settles that intent,
// even when its key is in two scopes and has characters a shell would read.
func TestHoldSuggestsARunnableResolve(t *testing.T) {
	l := effectsEnv(t)
	const scope, key = "payment.collect", "invoice:S 1's:v1"
	ctx := testenv.Context(t, time.Minute)
	in := idempotency.Intent{Scope: scope, Key: key, Request: order{key}, Task: idempotency.TaskRef{Actor: "w"}}
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		return idempotency.Result{}, errors.New("read timeout after the request was sent")
	}}
	_, err := l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	_, err = l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	confirmIntent(t, l, "refund.issue", key) // the same key in a second scope

	m := regexp.MustCompile("`(extworker effects resolve [^`]*)`").FindStringSubmatch(err.Error())
	require.NotNil(t, m, "no command in %q", err.Error())
	words := shellWords(t, m[1])
	require.Equal(t, []string{"extworker", "effects", "resolve"}, words[:3])
	i := slices.Index(words, "VERDICT")
	require.Positive(t, i, "the verdict to pick, in %q", m[1])
	words[i] = "rejected"
	out := mustEffects(t, words[2:]...)
	assert.Contains(t, out, "ledger: "+scope+"/"+key+" is now rejected")
	assert.Equal(t, idempotency.StateRejected, mustState(t, l, scope, key))
	assert.Equal(t, idempotency.StateConfirmed, mustState(t, l, "refund.issue", key), "the other scope's intent is untouched")
}
