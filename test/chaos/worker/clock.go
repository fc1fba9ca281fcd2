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

// deadlineTracker follows a session's deadline and remembers when it last
// moved: about when the latest acknowledged heartbeat's reply arrived, which
// is when the server last pushed its silence deadline (server package doc).
// Only the receive-time control uses it.
type deadlineTracker struct {
	s    *client.Session
	quit chan struct{}
	done chan struct{}

	mu      sync.Mutex
	last    time.Time // the deadline last seen
	movedAt time.Time // real time it was first seen
}

// trackDeadline starts a tracker of s; stop ends it.
func trackDeadline(s *client.Session) *deadlineTracker {
	t := &deadlineTracker{s: s, quit: make(chan struct{}), done: make(chan struct{}),
		last: s.Deadline(), movedAt: time.Now()}
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
			t.last, t.movedAt = d, time.Now()
		}
		t.mu.Unlock()
	}
}

func (t *deadlineTracker) stop() {
	close(t.quit)
	<-t.done
}

// pausable reports whether a grant received at recv arrived between
// controlMinGap and controlMaxGap after the deadline last moved, and did not
// move the deadline itself.
func (t *deadlineTracker) pausable(recv time.Time) bool {
	d := t.s.Deadline()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !d.Equal(t.last) {
		return false
	}
	gap := recv.Sub(t.movedAt)
	return gap >= controlMinGap && gap <= controlMaxGap
}
