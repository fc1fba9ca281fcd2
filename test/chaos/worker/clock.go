package worker

import (
	"sync"
	"time"

	"lock.dev/lockd/client"
)

// scaledClock is an SDK clock whose rate is scale times real time: 2 runs
// twice as fast, 0.5 half as fast. Its readings carry the monotonic clock
// (they are derived from base with Add).
type scaledClock struct {
	base  time.Time
	scale float64
}

var _ client.Clock = (*scaledClock)(nil)

func newScaledClock(scale float64) *scaledClock {
	return &scaledClock{base: time.Now(), scale: scale}
}

// Now returns the scaled time.
func (c *scaledClock) Now() time.Time {
	return c.base.Add(time.Duration(float64(time.Since(c.base)) * c.scale))
}

// AfterFunc calls f once d has passed on the scaled clock.
func (c *scaledClock) AfterFunc(d time.Duration, f func()) client.Timer {
	return time.AfterFunc(time.Duration(float64(d)/c.scale), f)
}

// real converts a reading of the scaled clock into real time.
func (c *scaledClock) real(t time.Time) time.Time {
	return c.base.Add(time.Duration(float64(t.Sub(c.base)) / c.scale))
}

// trackInterval is how often deadlineTracker polls.
const trackInterval = 5 * time.Millisecond

// ownMove is how close to the receipt of an acquire reply a move of the
// deadline is taken for that reply's own extension, not a heartbeat's.
const ownMove = 20 * time.Millisecond

// deadlineTracker follows a session's deadline and remembers when it moved:
// about when acknowledged heartbeats' replies arrived, which is when the
// server pushed its silence deadline (server package doc). Only the
// receive-time control uses it.
type deadlineTracker struct {
	s    *client.Session
	quit chan struct{}
	done chan struct{}

	mu    sync.Mutex
	last  time.Time   // the deadline last seen
	moves []time.Time // real times it was seen to move, the latest few
}

// trackDeadline starts a tracker of s; stop ends it.
func trackDeadline(s *client.Session) *deadlineTracker {
	t := &deadlineTracker{s: s, quit: make(chan struct{}), done: make(chan struct{}),
		last: s.Deadline(), moves: []time.Time{time.Now()}}
	go t.run() // exits on stop or when the session ends
	return t
}

func (t *deadlineTracker) run() {
	defer close(t.done)
	tick := time.NewTicker(trackInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.quit:
			return
		case <-t.s.Done():
			return
		case <-tick.C:
		}
		d := t.s.Deadline()
		t.mu.Lock()
		if !d.Equal(t.last) {
			t.last = d
			t.moves = append(t.moves, time.Now())
			if len(t.moves) > 8 {
				t.moves = t.moves[1:]
			}
		}
		t.mu.Unlock()
	}
}

func (t *deadlineTracker) stop() {
	close(t.quit)
	<-t.done
}

// pausable reports whether a grant whose acquire was sent at sent and
// answered at recv is one a pause makes the server free before recv + TTL:
// the acquire waited at least controlMinGap in the queue (the server pushes
// the silence deadline from the receipt of the acquire request), and the
// latest heartbeat reply before it arrived between controlMinGap and
// controlMaxGap earlier (so the next heartbeat is not about to be sent).
func (t *deadlineTracker) pausable(sent, recv time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	var lastHB time.Time
	for _, m := range t.moves {
		if m.Before(recv.Add(-ownMove)) {
			lastHB = m
		}
	}
	if lastHB.IsZero() {
		return false
	}
	gap := recv.Sub(lastHB)
	return recv.Sub(sent) >= controlMinGap && gap >= controlMinGap && gap <= controlMaxGap
}
