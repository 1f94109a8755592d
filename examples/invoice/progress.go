package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress shows what the demo is doing while it runs: instances started, how many have
// been paid, declined (the BPMN error) and are in an incident, and the events published
// and consumed. On a terminal it is one line redrawn in place every ttyTick; elsewhere
// (a pipe, a file, a test) a plain line every plainEvery, when something has changed
// since the last one, so a log of the run holds a few lines at most. stop clears the
// terminal's line: the summary that follows says it all.
type progress struct {
	out   io.Writer
	width int // the terminal's columns; 0: not a terminal
	every time.Duration
	start time.Time
	total int

	started                   atomic.Int64
	paid, declined, incidents atomic.Int64
	published, consumed       func() int64 // nil without events

	stopOnce sync.Once
	quit     chan struct{}
	done     chan struct{}
}

const (
	ttyTick    = 200 * time.Millisecond
	plainEvery = 5 * time.Second
)

// newProgress starts showing the progress of total instances on out, a terminal when
// out is one (terminalWidth), and with published and consumed (nil without events) the
// events' counts.
func newProgress(out io.Writer, total int, published, consumed func() int64) *progress {
	p := &progress{out: out, total: total, start: time.Now(), every: plainEvery, published: published, consumed: consumed,
		quit: make(chan struct{}), done: make(chan struct{})}
	if f, ok := out.(*os.File); ok {
		p.width = terminalWidth(f)
	}
	if p.width > 0 {
		p.every = ttyTick
	}
	go p.loop()
	return p
}

// fates records a sweep's counts of the instances' ends (waitDemo).
func (p *progress) fates(got map[string]int) {
	p.paid.Store(int64(got["paid"]))
	p.declined.Store(int64(got["declined"]))
	p.incidents.Store(int64(got["incident"]))
}

func (p *progress) loop() {
	defer close(p.done)
	t := time.NewTicker(p.every)
	defer t.Stop()
	last := ""
	for {
		select {
		case <-p.quit:
			if p.width > 0 && last != "" {
				fmt.Fprint(p.out, "\r\033[K")
			}
			return
		case <-t.C:
		}
		line := p.line()
		if line == last {
			continue
		}
		last = line
		if p.width > 0 {
			if len(line) >= p.width {
				line = p.compact()
			}
			fmt.Fprint(p.out, "\r\033[K"+fit(line, p.width-1))
		} else {
			fmt.Fprintln(p.out, "progress: "+line)
		}
	}
}

// line is the progress as one line of text.
func (p *progress) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%3ds  %d/%d instances started, %d paid, %d declined (BPMN error), %d in incident",
		int(time.Since(p.start).Seconds()), p.started.Load(), p.total, p.paid.Load(), p.declined.Load(), p.incidents.Load())
	if p.published != nil {
		fmt.Fprintf(&b, "; events: %d published, %d consumed", p.published(), p.consumed())
	}
	return b.String()
}

// compact is the line for a narrow terminal, without the time (under 80 columns with
// three-digit counts).
func (p *progress) compact() string {
	s := fmt.Sprintf("%d/%d started, %d paid, %d declined, %d incident",
		p.started.Load(), p.total, p.paid.Load(), p.declined.Load(), p.incidents.Load())
	if p.published != nil {
		s += fmt.Sprintf("; events %d out, %d in", p.published(), p.consumed())
	}
	return s
}

// fit shortens line to width columns (the progress line is ASCII).
func fit(line string, width int) string {
	if width > 3 && len(line) > width {
		return line[:width-3] + "..."
	}
	return line
}

// stop ends the display, clearing a terminal's line. Idempotent.
func (p *progress) stop() {
	p.stopOnce.Do(func() {
		close(p.quit)
		<-p.done
	})
}
