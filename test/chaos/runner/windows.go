package runner

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"lock.dev/lockd/test/chaos/fenced"
)

// Windows made on purpose (issue 21 §1). A fault that needs a window — a
// paused holder outlived by another grant's write, N holders trusting at
// once — makes it with a handshake or a barrier on the workers' hold lines
// (every worker waits for the harness's answer to each hold line before
// its grant's second write, -hold-ack), and waits for it with a deadline
// that fails the scenario with a message naming the window, instead of
// hoping that it happens within some number of cycles.

// The slow-clock control (SlowClock): worker 0's SDK clock runs at
// slowScale of real time and heartbeats every slowHeartbeat of its own
// time. Paused while it holds, its SDK trusts until its last answered
// heartbeat's send + (Remaining − margin)/slowScale of real time; lockd
// closes its session a TTL after it received that heartbeat. With
// Remaining as low as minRemaining (etcd: 1.23 s at the 2 s TTL) and the
// 0.5 s margin that is (1.23 − 0.5)×4 − 2 ≈ 0.9 s of trust after lockd
// frees the key at the least, in which the scenario's one key is granted
// to a waiting rival. At half speed it was (1.23 − 0.5)×2 − 2 < 0: no
// overlap at all when etcd's lease was late in its renewal cycle (measured
// overlaps of 0.4 s). The short interval keeps the slowed heartbeats
// (0.4 s of real time) well inside the TTL.
const (
	slowScale     = 0.25
	slowHeartbeat = 100 * time.Millisecond // client.MinHeartbeatInterval
)

// holdBarrier keeps the answers to the hold lines of the workers it is
// armed on until n of them hold at once, then lets them all go: n grants
// trusted and acting (written once, their second writes still to come) at
// the same instant, made rather than waited for.
type holdBarrier struct {
	n    int
	full chan struct{} // closed when n workers hold

	mu     sync.Mutex
	held   []*workerProc
	opened bool // open ran: no worker joins any more
}

// newHoldBarrier returns a barrier for n holders; arm puts it on workers.
func newHoldBarrier(n int) *holdBarrier {
	return &holdBarrier{n: n, full: make(chan struct{})}
}

// arm makes the barrier keep the next hold line of each of ws.
func (b *holdBarrier) arm(ws []*workerProc) {
	for _, w := range ws {
		w.bar.Store(b)
	}
}

// join is called by w's line reader on a hold line, before it decides
// the answer: unless the barrier is open, it keeps the answer back
// (withholdAck, before the barrier can fill, so that open, which may run
// as soon as it has, always finds the answer kept and sends it).
func (b *holdBarrier) join(w *workerProc) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.opened || slices.Contains(b.held, w) { // a kept worker prints no hold line: the second cannot happen
		return
	}
	w.withholdAck()
	b.held = append(b.held, w)
	if len(b.held) == b.n {
		close(b.full)
	}
}

// wait waits until n workers hold, or d has passed (d <= 0: no limit but
// ctx), and reports how many held.
func (b *holdBarrier) wait(ctx context.Context, d time.Duration) (int, error) {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-b.full:
	case <-timeout:
	case <-ctx.Done():
		return b.count(), ctx.Err()
	}
	return b.count(), nil
}

func (b *holdBarrier) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.held)
}

// open disarms the barrier from ws and answers every hold it kept.
func (b *holdBarrier) open(ws []*workerProc) {
	for _, w := range ws {
		w.bar.CompareAndSwap(b, nil)
	}
	b.mu.Lock()
	b.opened = true
	held := b.held
	b.mu.Unlock()
	for _, w := range held {
		w.answerHold()
	}
}

// superseded reports whether writes hold, accepted at or after run time
// since, a write of key by a writer other than proc that the fenced
// resource's rules (package fenced, Modes) put above grant (token, mode):
// once one is accepted, a late write of that grant is refused (with the
// check on), and with the check off it is a late write across another
// grant's. For a shared grant (a reader) only an exclusive write does.
func superseded(writes []fenced.Write, proc, key string, token uint64, mode string, since int64) bool {
	for _, w := range writes {
		if w.Key != key || w.Writer == proc || w.At < since || w.Token <= token {
			continue
		}
		if mode == fenced.ModeShared && w.Mode != fenced.ModeExclusive {
			continue
		}
		return true
	}
	return false
}

// awaitSuperseded waits, up to triggerTimeout, until the fenced resource
// has accepted a write that supersedes the grant w held at run time since
// (superseded).
func (r *run) awaitSuperseded(ctx context.Context, w *workerProc, key string, token uint64, mode string,
	since int64) error {
	for end := time.Now().Add(triggerTimeout); ; {
		if superseded(r.fenced.Writes(), w.proc, key, token, mode, since) {
			return nil
		}
		if err := r.checkAlive(); err != nil {
			return err
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s paused holding %q (token %d, %s) since %v: no other grant's write above it accepted within %v",
				w.proc, key, token, mode, time.Duration(since), triggerTimeout)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}
