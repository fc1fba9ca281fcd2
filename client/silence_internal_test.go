package client

import (
	"sync"
	"testing"
	"time"
)

// manualClock is a Clock whose time moves only with advance, which runs
// the timers that come due, in order, synchronously.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

type manualTimer struct {
	c       *manualClock
	at      time.Time
	f       func()
	stopped bool
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// advance moves the time by d, running every timer due on the way.
func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var next *manualTimer
		for _, t := range c.timers {
			if !t.stopped && !t.at.After(end) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		next.stopped = true
		c.now = next.at
		c.mu.Unlock()
		next.f()
	}
}

// TestSilenceCountsOnlyWaiting: the silence guard of a watch stream (C2
// #ct2-watch-progress) fires once the stream has been waited for, without
// a message, for its bound; time the consumer spends not reading never
// counts; a stream kept (onSilent false) is judged again a bound later;
// nothing fires after stop.
func TestSilenceCountsOnlyWaiting(t *testing.T) {
	const bound = 3 * time.Second
	c := &manualClock{now: time.Unix(1000, 0)}
	fired := 0
	s := newSilence(c, bound, func() bool { fired++; return false })

	c.advance(10 * bound) // never waited for: a slow consumer
	if fired != 0 {
		t.Fatalf("fired %d times while nobody waited for the stream; want 0", fired)
	}
	s.waiting(true)
	c.advance(bound - time.Millisecond)
	s.waiting(false) // a message
	s.waiting(true)
	c.advance(bound - time.Millisecond)
	if fired != 0 {
		t.Fatalf("fired %d times with a message every %v; want 0", fired, bound-time.Millisecond)
	}
	c.advance(time.Millisecond)
	if fired != 1 {
		t.Fatalf("fired %d times after a bound of silence; want 1", fired)
	}
	c.advance(bound - time.Millisecond)
	if fired != 1 {
		t.Fatalf("fired %d times before a second bound of silence; want 1 (kept: judged a bound later)", fired)
	}
	c.advance(time.Millisecond)
	if fired != 2 {
		t.Fatalf("fired %d times after a second bound of silence; want 2", fired)
	}
	s.setBound(2 * bound)
	c.advance(bound)
	if fired != 2 {
		t.Fatalf("fired %d times a bound after the bound doubled; want 2", fired)
	}
	c.advance(bound)
	if fired != 3 {
		t.Fatalf("fired %d times after the doubled bound; want 3", fired)
	}
	s.stop()
	c.advance(10 * bound)
	if fired != 3 {
		t.Fatalf("fired %d times after stop; want 3", fired)
	}
}
