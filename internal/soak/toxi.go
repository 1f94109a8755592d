package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// toxics runs Shopify's toxiproxy in this process: TCP proxies between the workers and
// what they talk to, whose links take toxics (latency, reset_peer) for a window of time.
// In-process, so the soak needs no toxiproxy server and no API port.
type toxics struct {
	srv *toxiproxy.ApiServer
}

func newToxics() *toxics {
	return &toxics{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())}
}

// proxy starts a proxy from a free loopback port to upstream (host:port).
func (t *toxics) proxy(name, upstream string) (*toxiProxy, error) {
	p := toxiproxy.NewProxy(t.srv, name, "127.0.0.1:0", upstream)
	if err := t.srv.Collection.Add(p, true); err != nil {
		return nil, fmt.Errorf("toxiproxy %s -> %s: %w", name, upstream, err)
	}
	return &toxiProxy{p: p}, nil
}

// close stops every proxy and drops their connections.
func (t *toxics) close() { _ = t.srv.Collection.Clear() }

type toxiProxy struct{ p *toxiproxy.Proxy }

// addr is where the proxy listens (host:port).
func (p *toxiProxy) addr() string { return p.p.Listen }

// add installs a toxic on one direction of every link, present and future: "upstream"
// is what the workers send, "downstream" what comes back.
func (p *toxiProxy) add(name, kind, stream string, attrs map[string]any) error {
	b, err := json.Marshal(map[string]any{"name": name, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		return err
	}
	if _, err := p.p.Toxics.AddToxicJson(bytes.NewReader(b)); err != nil {
		return fmt.Errorf("toxic %s on %s: %w", name, p.p.Name, err)
	}
	return nil
}

func (p *toxiProxy) remove(name string) error {
	if err := p.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		return fmt.Errorf("remove toxic %s from %s: %w", name, p.p.Name, err)
	}
	return nil
}

// window is one toxic applied to one proxy for a while, starting at a seeded offset
// into the kill phase.
type window struct {
	kind     string // as the report counts it, e.g. "toxic latency 500ms worker->provider"
	proxy    *toxiProxy
	toxic    string // toxiproxy's type
	stream   string
	attrs    map[string]any
	at, span time.Duration
}

// toxicWindows are the network faults (docs/reliability.md, The soak): 10 s of 500 ms
// latency and 5 s of reset_peer on the workers' link to the provider, and, when asked,
// a window of latency on their link to the engine; each at a seeded time within the
// first three quarters of the kill phase, so they overlap the kills and the restarts.
//
// reset_peer acts on the provider's answers (downstream): the charge is made and its
// answer lost, the hardest case for the ledger (an unknown outcome to reconcile, and a
// same-key resend that must not charge twice). Lookups during the window lose their
// answers too, so reconciliation has to wait it out.
func toxicWindows(rng *rand.Rand, phase time.Duration, provider, engine *toxiProxy, engineSpan time.Duration) []window {
	at := func(span time.Duration) time.Duration {
		room := max(phase*3/4-span, time.Second)
		return phase/10 + time.Duration(rng.Int64N(int64(room)))
	}
	ws := []window{
		{kind: "toxic latency 500ms worker->provider", proxy: provider, toxic: "latency", stream: "downstream",
			attrs: map[string]any{"latency": 500, "jitter": 100}, span: 10 * time.Second},
		{kind: "toxic reset_peer worker->provider", proxy: provider, toxic: "reset_peer", stream: "downstream",
			attrs: map[string]any{"timeout": 0}, span: 5 * time.Second},
	}
	if engine != nil && engineSpan > 0 {
		ws = append(ws, window{kind: "toxic latency 500ms worker->engine", proxy: engine, toxic: "latency", stream: "downstream",
			attrs: map[string]any{"latency": 500, "jitter": 100}, span: engineSpan})
	}
	for i := range ws {
		ws[i].at = at(ws[i].span)
	}
	return ws
}

// runWindows applies each window at its time after start and lifts it when it ends,
// counting those applied in injected (by kind). It returns when every window is over,
// or at once when ctx ends (lifting what is on).
func runWindows(ctx context.Context, start time.Time, ws []window, injected func(kind string), logf func(format string, args ...any)) {
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("soak-%d-%s", i, w.toxic)
			if !sleepUntil(ctx, start.Add(w.at)) {
				return
			}
			if err := w.proxy.add(name, w.toxic, w.stream, w.attrs); err != nil {
				logf("soak: %v", err)
				return
			}
			injected(w.kind)
			logf("soak: %s for %v from %.1fs", w.kind, w.span, time.Since(start).Seconds())
			sleepUntil(ctx, time.Now().Add(w.span))
			if err := w.proxy.remove(name); err != nil {
				logf("soak: %v", err)
			}
		}()
	}
	wg.Wait()
}

// sleepUntil waits until t or until ctx ends, reporting whether t was reached.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
