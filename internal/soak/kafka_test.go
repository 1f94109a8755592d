package soak

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The group's rebalances are counted from what the tap sees of it: a rebalance seen in
// progress once, however many looks it lasts; a change of the stable members seen without
// one (it began and ended between two looks); nothing for the first look or for looks
// that change nothing.
func TestRebalanceCounter(t *testing.T) {
	type look struct {
		state, members string
		counted        bool
	}
	for _, tc := range []struct {
		name  string
		looks []look
	}{
		{"the first look is the baseline", []look{{"PreparingRebalance", "", false}, {"Stable", "a,b", false}}},
		{"a rebalance seen over several looks counts once", []look{{"Stable", "a,b", false}, {"PreparingRebalance", "a,b", true},
			{"PreparingRebalance", "a,b", false}, {"CompletingRebalance", "a,c", false}, {"Stable", "a,c", false}}},
		{"members changed between two looks", []look{{"Stable", "a,b", false}, {"Stable", "a,b,c", true}, {"Stable", "a,b,c", false}}},
		{"two rebalances", []look{{"Stable", "a", false}, {"PreparingRebalance", "a", true}, {"Stable", "a,b", false},
			{"Stable", "b", true}, {"Empty", "", false}, {"PreparingRebalance", "", true}, {"Stable", "c", false}}},
		{"a group left empty and joined again between looks", []look{{"Empty", "", false}, {"Stable", "a", true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c rebalanceCounter
			for i, l := range tc.looks {
				assert.Equal(t, l.counted, c.observe(l.state, l.members), "look %d: %s %q", i, l.state, l.members)
			}
		})
	}
}
