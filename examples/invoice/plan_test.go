package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/examples/invoice/fakeprovider"
)

// planDemo decides the whole run before anything is sent: the README's numbers for the
// default 40 invoices, and each invoice's fate.
func TestPlanDemo(t *testing.T) {
	p := planDemo("r", 40)
	assert.Len(t, p.invoices, 40)
	assert.Equal(t, map[string]int{"paid": 32 + 2, "declined": 4, "incident": 4}, p.expect, "instances expected per end (the two duplicates included)")
	assert.Equal(t, 32, p.paid, "invoices charged once each")
	assert.Equal(t, 2, p.duplicates, "invoices 0 and 25 are submitted twice")
	assert.Len(t, p.amounts, 32)

	byIndex := func(i int) demoInvoice { return p.invoices[i] }
	assert.False(t, byIndex(9).vars.Has("amountCents"), "every tenth from 9 has no amount: an incident")
	assert.Equal(t, fakeprovider.LoseAnswer, byIndex(7).script, "the answer to 7's charge is lost: reconciled")
	assert.Equal(t, fakeprovider.DropBeforeAccept, byIndex(13).script, "13 is dropped unseen: sent again with the same key")
	assert.Zero(t, byIndex(4).script, "a declined invoice is not scripted")
	assert.True(t, byIndex(0).twice)
	assert.True(t, byIndex(25).twice)
	assert.False(t, byIndex(24).twice)
	assert.Equal(t, "INV-r-007", byIndex(7).id)
}
