package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The progress line names every count; on a terminal of 80 columns its compact form fits
// with three-digit counts, events included.
func TestProgressLine(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, 208, nil, nil)
	p.stop()
	p.start = time.Now().Add(-185 * time.Second)
	p.started.Store(208)
	p.fates(map[string]int{"paid": 168, "declined": 20, "incident": 20})
	assert.Equal(t, "185s  208/208 instances started, 168 paid, 20 declined (BPMN error), 20 in incident", p.line())
	p.published, p.consumed = func() int64 { return 160 }, func() int64 { return 176 }
	assert.Equal(t, "185s  208/208 instances started, 168 paid, 20 declined (BPMN error), 20 in incident; events: 160 published, 176 consumed", p.line())
	assert.Equal(t, "208/208 started, 168 paid, 20 declined, 20 incident; events 160 out, 176 in", p.compact())
	assert.LessOrEqual(t, len(p.compact()), 79)
	assert.Equal(t, "abcd...", fit("abcdefghij", 7))
	assert.Empty(t, out.String(), "nothing printed before the first tick (not a terminal: every %v)", plainEvery)
	assert.False(t, strings.Contains(out.String(), "\r"))
}
