package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// `effects resolutions --status all` lists requests in every status, as the console's
// /resolutions?status=all does (docs/console.md): one word in both tools, and the
// default of both.
func TestEffectsResolutionsStatusAll(t *testing.T) {
	l := effectsEnv(t)
	holdIntent(t, l, "payment.collect", "invoice:ALL", idempotency.TaskRef{Actor: "w"})
	out := mustEffectsAs(t, testenv.AliceLogin, "resolve", "invoice:ALL", "--as", "confirmed", "--provider-ref", "ch_all",
		"--reason", "charge found in the provider dashboard", "--operator", "alice")
	id := pendingID(t, out)

	row := `(?m)^` + id + `\s+payment.collect\s+invoice:ALL\s+.*\s+pending\s+`
	assert.Regexp(t, row, mustEffectsAs(t, testenv.AliceLogin, "resolutions", "--status", "all"))
	assert.Regexp(t, row, mustEffectsAs(t, testenv.AliceLogin, "resolutions"), "all is the default")
	assert.NotRegexp(t, row, mustEffectsAs(t, testenv.AliceLogin, "resolutions", "--status", "approved"), "a status still filters")
}
