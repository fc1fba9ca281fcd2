package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/Shopify/toxiproxy/v2/toxics"

	"lock.dev/lockd/test/chaos/history"
)

// The far-holder scenario (Fault FarHolder) and its receive-time control
// (Control RecvTimeSDK).
//
// Worker 0 reaches lockd through a toxiproxy proxy that delays every byte
// by farLatency each way; the other workers, its rivals for the keys, talk
// to lockd directly. lockd runs on PostgreSQL, whose heartbeats and grants
// report Remaining measured from the last heartbeat's receipt (the full TTL
// right after it), with a safety margin (farMargin) well below the latency.
// The harness pauses worker 0 while it holds, at a moment when no request of
// it is in flight and the answer to its last one has been delivered to it
// (linkActivity.answered), so that the last heartbeat its SDK applied is
// the last one the server received. Then:
//
//   - the correct SDK trusts until send + Remaining − margin, which is
//     farLatency + farMargin before the backend can free the key;
//   - an SDK that counts from the receipt of the reply trusts until the
//     downstream latency − farMargin AFTER the backend can free it, and a
//     rival waiting next to lockd gets the key in that window: a trusted
//     overlap that check.NoTrustedOverlap must report. The control runs on
//     one key, so every rival waits for it while worker 0 holds it, and
//     lockd hands it on at once when it frees it (its server closes a
//     silent session itself, without waiting for the reaper).
//
// Worker 0 heartbeats every farHeartbeat: long enough that its requests
// are often all answered (a heartbeat is in flight for a round trip,
// 2×farLatency, of each interval), short enough that the next reply still
// arrives before the correct SDK's deadline (farHeartbeat + 2×farLatency <
// TTL − margin).
//
// The receive-time control's link has the same round trip, split unevenly
// (farUpControl, farDownControl): the receive-time SDK trusts
// farDownControl − farMargin = 500ms past the backend's expiry instead of
// farLatency − farMargin = 250ms, twice the window for the rival waiting
// for the scenario's one key to be granted in, while every bound above,
// which depends on the round trip only, stays as it is. The correct SDK
// still stops farUpControl + farMargin before lockd can free the key.
const (
	farLatency   = 300 * time.Millisecond
	farMargin    = 50 * time.Millisecond
	farHeartbeat = 1200 * time.Millisecond
	// farReaper is the PostgreSQL reaper interval of the scenario: the
	// backend frees an expired session's keys within it, well inside the
	// time the receive-time control trusts too long.
	farReaper = 100 * time.Millisecond
	// farApply is how long after the last answer was delivered to worker
	// 0 a hold may be paused: time for its SDK to read and apply it. (The
	// pause used to wait only for the round trip + 100 ms since worker 0
	// last sent, inferring the answer; a slow PostgreSQL beside a CPU
	// burner can take longer to answer than that, and the pause then lands
	// before the answer: control-recvtime-sdk-pg once caught nothing in a
	// cycle.)
	farApply = 100 * time.Millisecond

	farUpControl   = 50 * time.Millisecond
	farDownControl = 2*farLatency - farUpControl
)

// farDelays returns the scenario's upstream and downstream latency.
func (r *run) farDelays() (up, down time.Duration) {
	if r.spec.Control == RecvTimeSDK {
		return farUpControl, farDownControl
	}
	return farLatency, farLatency
}

// farLink is worker 0's link to lockd: the proxy and when worker 0 last
// sent a byte through it.
type farLink struct {
	name string
	px   *proxy
	act  *linkActivity
}

// close stops the proxy and lets the link's toxics end.
func (f *farLink) close() {
	f.act.stop()
	f.px.close()
	activityMu.Lock()
	delete(activities, f.name)
	activityMu.Unlock()
}

// linkActivity is what the far toxics of one link share: when bytes last
// entered it upstream and when they were last delivered downstream,
// whether the harness holds the link (hold), and a channel closed when the
// link is torn down.
type linkActivity struct {
	mu       sync.Mutex
	lastUp   time.Time     // a chunk's arrival, upstream
	lastDown time.Time     // a chunk's delivery, downstream
	held     chan struct{} // non-nil while held; closed by release
	stopped  chan struct{}
	stopOnce sync.Once
}

// hold makes the link's toxics keep every chunk that arrives, and every
// one after it, until release: nothing is dropped, the bytes are late.
func (a *linkActivity) hold() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held == nil {
		a.held = make(chan struct{})
	}
}

// release lets the chunks hold kept go on, in order.
func (a *linkActivity) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held != nil {
		close(a.held)
		a.held = nil
	}
}

// gate returns a channel closed when the link is released, nil if it is
// not held.
func (a *linkActivity) gate() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

func (a *linkActivity) saw(t time.Time, down bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	last := &a.lastUp
	if down {
		last = &a.lastDown
	}
	if t.After(*last) {
		*last = t
	}
}

// answered reports whether the link's client has nothing in flight and has
// had the answer to its last request for at least apply: it has sent
// nothing for rtt, and a chunk was delivered to it at least rtt after its
// last one was sent and at least apply ago. It also returns that last
// send, which the caller can compare later (lastSent).
func (a *linkActivity) answered(rtt, apply time.Duration) (bool, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	return now.Sub(a.lastUp) >= rtt && a.lastDown.Sub(a.lastUp) >= rtt && now.Sub(a.lastDown) >= apply, a.lastUp
}

// lastSent returns when bytes last entered the link upstream.
func (a *linkActivity) lastSent() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastUp
}

func (a *linkActivity) stop() { a.stopOnce.Do(func() { close(a.stopped) }) }

// farToxic is a toxiproxy toxic that delays every chunk by Latency ms from
// its arrival (like toxiproxy's latency toxic) and, with Observe "up" or
// "down", records each chunk's arrival (upstream) or delivery (downstream)
// in the linkActivity registered under Link. Unlike the latency
// toxic of v2.12.0, whose delivery blocks forever once the connection's
// writer is gone (a goroutine leaked per connection closed with data in
// flight), it stops delivering when the link is torn down and drains its
// input until the reader ends. toxiproxy builds a fresh value per toxic
// from its JSON attributes, hence the registry.
type farToxic struct {
	Link    string `json:"link"`
	Latency int64  `json:"latency"`
	Observe string `json:"observe"`
}

var (
	registerFar sync.Once
	activityMu  sync.Mutex
	activities  = map[string]*linkActivity{}
)

func activityOf(link string) *linkActivity {
	activityMu.Lock()
	defer activityMu.Unlock()
	a := activities[link]
	if a == nil {
		a = &linkActivity{stopped: make(chan struct{})}
		activities[link] = a
	}
	return a
}

// Pipe implements toxics.Toxic. It returns when its input ends, when it is
// interrupted (toxics changed; not done here), or after the link is torn
// down and its input drained.
func (t *farToxic) Pipe(stub *toxics.ToxicStub) {
	act := activityOf(t.Link)
	delay := time.Duration(t.Latency) * time.Millisecond
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if t.Observe == "up" && !flowControlOnly(c.Data) {
				act.saw(c.Timestamp, false)
			}
			wait := time.NewTimer(delay - time.Since(c.Timestamp))
			select {
			case <-wait.C:
			case <-stub.Interrupt:
			case <-act.stopped:
			}
			wait.Stop()
			if g := act.gate(); g != nil { // held (UpstreamHold): until released
				select {
				case <-g:
				case <-stub.Interrupt:
				case <-act.stopped:
				}
			}
			select {
			case stub.Output <- c:
				if t.Observe == "down" {
					act.saw(time.Now(), true)
				}
			case <-act.stopped:
				for c := range stub.Input { // until the reader closes it
					if c == nil {
						break
					}
				}
				stub.Close()
				return
			}
		}
	}
}

// farSettings applies the scenario's own lockd settings.
func (r *run) farSettings() {
	if r.spec.Fault != FarHolder {
		return
	}
	r.opts.Margin = farMargin
	r.opts.Reaper = farReaper
}

// startFar starts worker 0's proxy to lockd (FarHolder only).
func (r *run) startFar() error {
	if r.spec.Fault != FarHolder {
		return nil
	}
	registerFar.Do(func() { toxics.Register("chaos_far", new(farToxic)) })
	px, err := newProxy(r.spec.Name+"-far", r.lockds[0].Addr())
	if err != nil {
		return err
	}
	link := r.spec.Name + "-far"
	up, down := r.farDelays()
	for _, stream := range []string{"upstream", "downstream"} {
		latency := up
		if stream == "downstream" {
			latency = down
		}
		js := fmt.Sprintf(`{"name":"far_%s","type":"chaos_far","stream":%q,"toxicity":1,`+
			`"attributes":{"link":%q,"latency":%d,"observe":%q}}`,
			stream, stream, link, latency.Milliseconds(), strings.TrimSuffix(stream, "stream"))
		if _, err := px.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			px.close()
			return fmt.Errorf("proxy %s: add toxic: %w", px.name, err)
		}
	}
	r.far = &farLink{name: link, px: px, act: activityOf(link)}
	return nil
}

// planFar sets up worker 0 of FarHolder: through the far link, a longer
// heartbeat interval, and under RecvTimeSDK the receive-time SDK.
func (r *run) planFar(ws *workerSpec) {
	ws.lockd = []string{r.far.px.addr()}
	ws.heartbeatInterval = farHeartbeat
	switch {
	case r.spec.breaks(RecvTimeSDK) && ws.sdk == PythonSDK:
		ws.env = append(ws.env, "LOCKD_PYSDK_CONTROL=recvtime") // built into the Python SDK (lockd.session)
	case r.spec.breaks(RecvTimeSDK) && ws.sdk == TypeScriptSDK:
		ws.env = append(ws.env, "LOCKD_TSSDK_CONTROL=recvtime") // built into the TypeScript SDK (src/session.ts)
	case r.spec.breaks(RecvTimeSDK):
		ws.bin = r.env.bins.WorkerRecvTime
	}
}

// pauseFarHolder pauses worker 0 while it holds and none of its requests is
// in flight. The worker waits at its hold line for the runner's answer
// (-hold-ack), sending only its SDK's heartbeats meanwhile, so the runner
// waits there for the link's next answered window (linkActivity.answered:
// the answer to the last heartbeat delivered farApply ago, the next not
// sent yet; one comes every heartbeat interval) instead of letting the
// hold go and hoping a later hold line falls in one: a run skipped every
// hold for 45 s once. A hold whose trust already ended (its SDK gave the
// session up when an answer came too late, a lost op in the worker's
// history: beside a CPU burner, once in ten cycles) is let go instead, and
// the next one tried: a pause of a worker that holds nothing tests nothing
// (check.PausesHitHolders: "it held no key then"). Once the worker is
// stopped the runner checks that nothing left it after the window was
// seen (a heartbeat sent between the check and the stop) and says so if
// something did: for the receive-time control that cycle's window is lost,
// and it runs another.
func (r *run) pauseFarHolder(ctx context.Context) error {
	up, down := r.farDelays()
	var sent time.Time // the last send the window was seen after
	return r.pauseHolderWith(ctx, r.targets, func(w *workerProc) bool {
		key, token, _ := w.held()
		for end := time.Now().Add(2 * farHeartbeat); ; {
			ok, last := r.far.act.answered(up+down, farApply)
			if ok {
				if r.trustEnded(w, key, token) {
					r.logf("%s stopped trusting %q (token %d) before an answered window: not paused", w.proc, key, token)
					return false
				}
				sent = last
				return true
			}
			if time.Now().After(end) || ctx.Err() != nil {
				return false
			}
			time.Sleep(10 * time.Millisecond) // polling the link's activity, not synchronising with it
		}
	}, func(_ context.Context, w *workerProc) error {
		if last := r.far.act.lastSent(); last.After(sent) {
			r.logf("%s sent on its far link %v after the answered window was seen, before it stopped: a request was in flight at the pause",
				w.proc, last.Sub(sent).Round(time.Millisecond))
		}
		return nil
	})
}

// trustEnded reports whether w's history records the end of its trust in
// grant (key, token) otherwise than by a release: a lost op (its SDK's
// Done closed, the worker recording the SDK's deadline). An unreadable
// history counts as ended: the hold is not paused.
func (r *run) trustEnded(w *workerProc, key string, token uint64) bool {
	f, err := os.Open(filepath.Join(r.histDir, w.proc+".jsonl"))
	if err != nil {
		return true
	}
	defer f.Close()
	hf, err := history.Read(f)
	if err != nil {
		return true
	}
	for _, op := range hf.Ops {
		if op.Kind == history.Lost && op.Key == key && op.Token == token {
			return true
		}
	}
	return false
}

// flowControlOnly reports whether chunk is whole HTTP/2 frames that carry
// no request: WINDOW_UPDATE, and the acks of a PING or SETTINGS. gRPC's
// C core (the Python SDK) sends a WINDOW_UPDATE for every reply it reads,
// at once; counted as a send, it would leave the far link never idle after
// an answer (linkActivity.answered), and the far holder never pausable. A
// chunk with anything else, or a frame cut at its end, is a send.
func flowControlOnly(chunk []byte) bool {
	const (
		frameSettings     = 0x4
		framePing         = 0x6
		frameWindowUpdate = 0x8
		flagAck           = 0x1
	)
	if len(chunk) == 0 {
		return false
	}
	for len(chunk) > 0 {
		if len(chunk) < 9 {
			return false
		}
		n := int(chunk[0])<<16 | int(chunk[1])<<8 | int(chunk[2])
		typ, flags := chunk[3], chunk[4]
		if len(chunk) < 9+n {
			return false
		}
		switch {
		case typ == frameWindowUpdate:
		case (typ == framePing || typ == frameSettings) && flags&flagAck != 0:
		default:
			return false
		}
		chunk = chunk[9+n:]
	}
	return true
}
