package client

import (
	"sync"
	"time"
)

// silence guards one watch stream (C2 #ct2-watch-progress): it calls
// onSilent once the stream has been waited for, without a message, for
// bound. Only time spent waiting counts (waiting(true) … waiting(false)
// around each receive). onSilent reports whether it ended the stream; if
// not, the stream is judged again after another bound. Its timer runs on
// the client's clock; stop ends it. The nil *silence does nothing.
type silence struct {
	clock    Clock
	onSilent func() bool

	mu      sync.Mutex
	bound   time.Duration
	wait    bool      // a receive is in progress
	since   time.Time // when it started (or when the stream was last judged)
	timer   Timer
	stopped bool
}

func newSilence(clock Clock, bound time.Duration, onSilent func() bool) *silence {
	s := &silence{clock: clock, onSilent: onSilent, bound: bound}
	s.mu.Lock()
	s.timer = clock.AfterFunc(bound, s.check) // re-armed by check until stop
	s.mu.Unlock()
	return s
}

// waiting records that a receive starts (true) or returned (false).
func (s *silence) waiting(on bool) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.wait, s.since = on, s.clock.Now()
	s.mu.Unlock()
}

// setBound changes the bound (a new progress interval); it applies from
// the next check.
func (s *silence) setBound(d time.Duration) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.bound = d
	s.mu.Unlock()
}

// stop ends the guard; onSilent is not called after it returns unless a
// check was already calling it.
func (s *silence) stop() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.stopped = true
	s.timer.Stop()
	s.mu.Unlock()
}

// check is the timer's function: it judges the stream and re-arms.
func (s *silence) check() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	next := s.bound
	if s.wait {
		quiet := s.clock.Now().Sub(s.since)
		if quiet < s.bound {
			next = s.bound - quiet
		} else {
			s.mu.Unlock()
			if s.onSilent() {
				return // the stream ends: nothing more to judge
			}
			s.mu.Lock()
			if s.stopped {
				s.mu.Unlock()
				return
			}
			s.since = s.clock.Now() // kept: judge it again after another bound
		}
	}
	s.timer = s.clock.AfterFunc(next, s.check)
	s.mu.Unlock()
}
