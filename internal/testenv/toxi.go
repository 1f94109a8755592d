package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"
)

// ToxiProxy is a Toxiproxy proxy (github.com/Shopify/toxiproxy, run inside the test
// process, no daemon and no HTTP API) between a client under test and a real server. A
// test adds and removes toxics by name on either direction to make the network misbehave
// for real at the socket level: latency, answers that never come, resets, truncation,
// slow or sliced streams; Disable and Enable take the whole link away and back.
type ToxiProxy struct {
	t     testing.TB
	addr  string
	proxy *toxiproxy.Proxy
	// ctx carries a disabled zerolog logger: toxiproxy logs removals through the context.
	ctx context.Context

	mu    sync.Mutex
	fuses map[string]string // toxic name -> its fuse id (LoseOnce)
}

// Direction is the way the data a toxic acts on flows.
type Direction string

const (
	// Upstream is client to server: requests.
	Upstream Direction = "upstream"
	// Downstream is server to client: answers.
	Downstream Direction = "downstream"
)

// Toxic is one of toxiproxy's faults, with its settings: Latency, Timeout, ResetPeer,
// LimitData, Bandwidth or Slicer.
type Toxic interface {
	toxicType() string
	attributes() any
}

// Latency delays every chunk by Delay, plus or minus up to Jitter.
type Latency struct{ Delay, Jitter time.Duration }

// Timeout passes nothing more in its direction: data is dropped. With After > 0 the
// connection is closed after that long; with 0 it stays open, silent, until the toxic is
// removed, and removing it closes the connections it held. Downstream, it is the answer
// that never comes for a request the server did receive.
type Timeout struct{ After time.Duration }

// ResetPeer resets the connection (TCP RST when the toxic was present as the connection
// opened, else a close) once data arrives in its direction, after After; the data is lost.
type ResetPeer struct{ After time.Duration }

// LimitData passes Bytes bytes in its direction on each connection, counted from when
// the toxic was added, then closes the connection.
type LimitData struct{ Bytes int64 }

// Bandwidth caps the rate in its direction, in KB per second.
type Bandwidth struct{ KBPerSecond int64 }

// Slicer cuts each chunk into pieces of about AverageSize bytes (plus or minus
// SizeVariation, which must be smaller), waiting Delay between pieces: partial reads.
type Slicer struct {
	AverageSize, SizeVariation int
	Delay                      time.Duration
}

func (Latency) toxicType() string   { return "latency" }
func (Timeout) toxicType() string   { return "timeout" }
func (ResetPeer) toxicType() string { return "reset_peer" }
func (LimitData) toxicType() string { return "limit_data" }
func (Bandwidth) toxicType() string { return "bandwidth" }
func (Slicer) toxicType() string    { return "slicer" }

func (x Latency) attributes() any {
	return toxics.LatencyToxic{Latency: x.Delay.Milliseconds(), Jitter: x.Jitter.Milliseconds()}
}
func (x Timeout) attributes() any   { return toxics.TimeoutToxic{Timeout: x.After.Milliseconds()} }
func (x ResetPeer) attributes() any { return toxics.ResetToxic{Timeout: x.After.Milliseconds()} }
func (x LimitData) attributes() any { return toxics.LimitDataToxic{Bytes: x.Bytes} }
func (x Bandwidth) attributes() any { return toxics.BandwidthToxic{Rate: x.KBPerSecond} }
func (x Slicer) attributes() any {
	return toxics.SlicerToxic{AverageSize: x.AverageSize, SizeVariation: x.SizeVariation, Delay: int(x.Delay.Microseconds())}
}

// Toxi starts a proxy named name on a free loopback port, forwarding to upstream
// ("host:port"), with no toxics. It is stopped at cleanup. Toxiproxy's own logging is
// silenced (zerolog.Nop).
func Toxi(t testing.TB, name, upstream string) *ToxiProxy {
	t.Helper()
	quiet := zerolog.Nop()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), quiet)
	proxy := toxiproxy.NewProxy(server, name, "127.0.0.1:0", upstream)
	if err := proxy.Start(); err != nil {
		t.Fatalf("toxiproxy %s: listen: %v", name, err)
	}
	p := &ToxiProxy{t: t, addr: proxy.Listen, proxy: proxy, ctx: quiet.WithContext(context.Background()), fuses: map[string]string{}}
	t.Cleanup(func() {
		proxy.Stop()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, id := range p.fuses {
			fuses.Delete(id)
		}
	})
	return p
}

// Addr is the proxy's "host:port"; it stays the same across Disable and Enable.
func (p *ToxiProxy) Addr() string { return p.addr }

// Add adds a toxic named name in direction dir. It applies to open connections too.
func (p *ToxiProxy) Add(name string, dir Direction, x Toxic) {
	p.t.Helper()
	p.add(name, dir, x.toxicType(), x.attributes())
}

func (p *ToxiProxy) add(name string, dir Direction, typ string, attrs any) {
	p.t.Helper()
	body, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": string(dir), "attributes": attrs})
	if err != nil {
		p.t.Fatalf("toxiproxy %s: toxic %s: %v", p.proxy.Name, name, err)
	}
	if _, err := p.proxy.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		p.t.Fatalf("toxiproxy %s: add toxic %s (%s %s): %v", p.proxy.Name, name, typ, dir, err)
	}
}

// Remove removes the toxic named name (both halves of a LoseOnce).
func (p *ToxiProxy) Remove(name string) {
	p.t.Helper()
	p.mu.Lock()
	id, fuse := p.fuses[name]
	delete(p.fuses, name)
	p.mu.Unlock()
	if !fuse {
		if err := p.proxy.Toxics.RemoveToxic(p.ctx, name); err != nil {
			p.t.Fatalf("toxiproxy %s: remove toxic %s: %v", p.proxy.Name, name, err)
		}
		return
	}
	for _, half := range []string{name + "/watch", name + "/answer"} {
		if err := p.proxy.Toxics.RemoveToxic(p.ctx, half); err != nil {
			p.t.Fatalf("toxiproxy %s: remove toxic %s: %v", p.proxy.Name, half, err)
		}
	}
	fuses.Delete(id)
}

// Disable takes the link away: new connections are refused and open ones are closed.
func (p *ToxiProxy) Disable() { p.proxy.Stop() }

// Enable listens again, on the same address.
func (p *ToxiProxy) Enable() {
	p.t.Helper()
	if err := p.proxy.Start(); err != nil {
		p.t.Fatalf("toxiproxy %s: listen again on %s: %v", p.proxy.Name, p.addr, err)
	}
}

// Loss is what a LoseOnce fault loses.
type Loss int

const (
	// LoseRequest drops the client's chunk that carries the marker and closes that
	// connection: the server never sees the request.
	LoseRequest Loss = iota + 1
	// LoseAnswer delivers the chunk that carries the marker, then drops the next chunk
	// the server sends and closes that connection: the server acted, the client cannot
	// know. The dropped chunk is the first answer on any of the proxy's connections, so
	// the fault is precise on a link with one conversation in flight at that moment.
	LoseAnswer
)

// LoseOnce arms a one-shot fault on the first chunk sent upstream that contains marker
// (found within one chunk: a message written at once, such as a PostgreSQL Bind with its
// parameters). The link must carry plaintext: with TLS (PostgreSQL's default sslmode
// prefer negotiates it) nothing matches, so point the client at the proxy with
// sslmode=disable. The returned channel is closed when the fault has fired. Remove(name)
// disarms it; it stays in place, inert, after firing.
//
// Toxiproxy's own toxics act on time and byte counts only; this one acts on content, so a
// test can lose exactly the answer to one request without a hook in the code under test.
func (p *ToxiProxy) LoseOnce(name string, marker []byte, loss Loss) <-chan struct{} {
	p.t.Helper()
	registerFuseToxics.Do(func() {
		toxics.Register(watchToxicType, new(watchToxic))
		toxics.Register(answerToxicType, new(answerToxic))
	})
	f := &fuse{marker: bytes.Clone(marker), loss: loss, fired: make(chan struct{})}
	id := strconv.FormatInt(fuseSeq.Add(1), 10)
	fuses.Store(id, f)
	p.mu.Lock()
	p.fuses[name] = id
	p.mu.Unlock()
	p.add(name+"/watch", Upstream, watchToxicType, fuseAttrs{Fuse: id})
	p.add(name+"/answer", Downstream, answerToxicType, fuseAttrs{Fuse: id})
	return f.fired
}

// Fuses live in a registry because toxiproxy builds each toxic from its JSON settings:
// the two halves of a LoseOnce find their shared state by id.
var (
	registerFuseToxics sync.Once
	fuses              sync.Map // id -> *fuse
	fuseSeq            atomic.Int64
)

const (
	watchToxicType  = "extworker_lose_once_watch"
	answerToxicType = "extworker_lose_once_answer"
)

const (
	fuseArmed   = iota
	fuseTripped // LoseAnswer: the marked request passed, the next answer is to be lost
	fuseFired
)

type fuse struct {
	marker []byte
	loss   Loss
	state  atomic.Int32
	fired  chan struct{}
}

func (f *fuse) fire() { close(f.fired) }

type fuseAttrs struct {
	Fuse string `json:"fuse"`
}

func lookupFuse(id string) *fuse {
	if f, ok := fuses.Load(id); ok {
		return f.(*fuse)
	}
	return nil
}

// watchToxic passes client data upstream and trips its fuse on the marker.
type watchToxic struct {
	Fuse string `json:"fuse"`
}

func (x *watchToxic) Pipe(stub *toxics.ToxicStub) {
	f := lookupFuse(x.Fuse)
	pipeUntil(stub, func(c *stream.StreamChunk) bool {
		if f != nil && f.state.Load() == fuseArmed && bytes.Contains(c.Data, f.marker) {
			if f.loss == LoseRequest && f.state.CompareAndSwap(fuseArmed, fuseFired) {
				f.fire()
				return true
			}
			f.state.CompareAndSwap(fuseArmed, fuseTripped)
		}
		return false
	})
}

// answerToxic passes server data downstream, except the first chunk after its fuse
// tripped: that one is dropped and its connection closed.
type answerToxic struct {
	Fuse string `json:"fuse"`
}

func (x *answerToxic) Pipe(stub *toxics.ToxicStub) {
	f := lookupFuse(x.Fuse)
	pipeUntil(stub, func(*stream.StreamChunk) bool {
		if f != nil && f.state.CompareAndSwap(fuseTripped, fuseFired) {
			f.fire()
			return true
		}
		return false
	})
}

// pipeUntil passes the stub's chunks on until drop returns true for one: that chunk is
// lost and the connection dropped.
func pipeUntil(stub *toxics.ToxicStub, drop func(*stream.StreamChunk) bool) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if drop(c) {
				dropConnection(stub)
				return
			}
			stub.Output <- c
		}
	}
}

// dropConnection closes the stub's output, which closes its connection, and drains what
// is still coming so the toxics before it never block. A closed stub is left alone by
// toxiproxy when the toxic is later removed.
func dropConnection(stub *toxics.ToxicStub) {
	stub.Close()
	for range stub.Input {
	}
}
