package client

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// armLocked (re)starts the deadline timer at the earliest of the session's
// and its locks' deadlines (s.mu held).
func (s *Session) armLocked() {
	if s.timer != nil {
		s.timer.Stop()
	}
	at := s.earliestLocked()
	s.timerGen++
	gen := s.timerGen
	s.timerAt = at
	s.timer = s.c.clock.AfterFunc(at.Sub(s.c.clock.Now()), func() { s.deadlineReached(gen) })
}

// earliestLocked is the earliest of the session's and its locks'
// deadlines (s.mu held).
func (s *Session) earliestLocked() time.Time {
	at := s.deadline
	for _, l := range s.locks {
		if l.deadline.Before(at) {
			at = l.deadline
		}
	}
	return at
}

// earliestDeadline is earliestLocked for a session that has not ended;
// ok is false once it has.
func (s *Session) earliestDeadline() (at time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return time.Time{}, false
	}
	return s.earliestLocked(), true
}

func (s *Session) deadlineReached(gen uint64) {
	s.mu.Lock()
	if gen != s.timerGen || s.err != nil {
		s.mu.Unlock()
		return
	}
	now := s.c.clock.Now()
	if !now.Before(s.deadline) {
		s.mu.Unlock()
		s.end(ErrSessionExpired)
		return
	}
	// A lock whose own deadline passed: no answer confirmed it since.
	var lost []*Lock
	for key, l := range s.locks {
		if !now.Before(l.deadline) {
			delete(s.locks, key)
			lost = append(lost, l)
		}
	}
	s.armLocked() // extended since armed, or an early wake-up of a real timer
	s.mu.Unlock()
	for _, l := range lost {
		l.end(l.unconfirmed(now, "not confirmed by the server before its deadline"))
	}
}

// unconfirmed is the error of a lock that no answer confirms any more,
// found at now (client clock): ErrMaxHold once its maximum hold may have
// run out, else ErrLockLost (C2 #ct2-maxhold-sdk). The send time of the
// Acquire plus the hold is a lower bound of the hold's end on the server,
// so before it the hold cannot be why. A notice that comes later changes
// nothing: a lock keeps its first error.
func (l *Lock) unconfirmed(now time.Time, why string) error {
	if !l.maxHoldAt.IsZero() && !now.Before(l.maxHoldAt) {
		return fmt.Errorf("%w: %s (its maximum hold had run out)", ErrMaxHold, why)
	}
	return fmt.Errorf("%w: %s", ErrLockLost, why)
}

// extend applies an acknowledgement of the session (a grant reply): a
// request sent at sent (client clock) was answered with remaining. The
// session's deadline becomes the later of the current one and sent +
// remaining − margin; its locks are not extended (only answers that confirm
// a lock extend it: answer). A deadline that has already passed is never
// revived: the session ends instead. It returns the new deadline bound.
func (s *Session) extend(sent time.Time, remaining time.Duration) time.Time {
	d := trustFrom(s.c.clock, sent).Add(remaining - s.margin)
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return d
	}
	if !s.c.clock.Now().Before(s.deadline) {
		s.mu.Unlock()
		s.end(ErrSessionExpired)
		return d
	}
	if d.After(s.deadline) {
		// The timer stays armed at the earlier deadline: when it fires it
		// finds the later one and arms itself again (deadlineReached), so
		// an extension costs no timer operation.
		s.deadline = d
	}
	s.mu.Unlock()
	return d
}

// answer applies a heartbeat answer to a request sent at sent, when the
// session's lockSeq was seq (C2 #ct2-confirm). With held set (the server
// confirms locks), a lock listed with its token is confirmed, and a lock
// numbered up to seq that is not listed is lost at once; without it (an
// older server), every lock counts as confirmed. When live (a live answer
// without error), the session and every confirmed lock are extended to
// sent + remaining − margin.
func (s *Session) answer(sent time.Time, seq uint64, live bool, remaining time.Duration, held *lockdv1.HeldLocks) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	now := s.c.clock.Now()
	if live && !now.Before(s.deadline) {
		s.mu.Unlock()
		s.end(ErrSessionExpired)
		return
	}
	var listed map[string]uint64
	if held != nil {
		listed = make(map[string]uint64, len(held.GetLocks()))
		for _, h := range held.GetLocks() {
			listed[h.GetKey()] = h.GetToken()
		}
	}
	d := trustFrom(s.c.clock, sent).Add(remaining - s.margin)
	var lost []*Lock
	for key, l := range s.locks {
		if tok, ok := listed[key]; held == nil || (ok && tok == l.token) {
			if live && d.After(l.deadline) {
				l.deadline = d // the timer finds it when it fires (deadlineReached)
			}
			continue
		}
		if l.seq <= seq {
			delete(s.locks, key)
			s.fenceLocked(key, l.token)
			lost = append(lost, l)
		}
	}
	if live && d.After(s.deadline) {
		s.deadline = d
	}
	// Grants of the session that no Lock and no call under way knows: a
	// place kept for a call that gave up was handed the key (C2
	// #ct2-keep-place). Release them.
	var orphans []*lockdv1.HeldLock
	for _, h := range held.GetLocks() {
		if s.locks[h.GetKey()] == nil && s.busy[h.GetKey()] == 0 && h.GetToken() > s.lostTok[h.GetKey()] {
			orphans = append(orphans, h)
		}
	}
	s.mu.Unlock()
	for _, l := range lost {
		l.end(l.unconfirmed(now, "not confirmed by the server"))
	}
	for _, h := range orphans {
		s.releaseOrphan(h.GetKey(), h.GetToken())
	}
}

// releaseOrphan releases, in the background and best effort, a grant of
// the session that no Lock knows (fenced by its token: never a newer one).
func (s *Session) releaseOrphan(key string, token uint64) {
	s.mu.Lock()
	s.fenceLocked(key, token) // once is enough; a later answer may list it again meanwhile
	s.mu.Unlock()
	s.c.wg.Add(1)
	go func() { // exits when the RPC returns: bounded by DefaultCloseTimeout, the session and the client
		defer s.c.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, DefaultCloseTimeout)
		defer cancel()
		stop := context.AfterFunc(s.c.ctx, cancel)
		defer stop()
		_, err := s.c.api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: s.id, SessionSecret: s.secret, Key: key, Token: token})
		s.c.log.LogAttrs(context.Background(), slog.LevelDebug, "released a grant no lock knew",
			slog.String("key", key), slog.Uint64("token", token), slog.Bool("ok", err == nil))
	}()
}

// busyKey marks a call on key under way until the returned function is
// called.
func (s *Session) busyKey(key string) func() {
	s.mu.Lock()
	if s.busy == nil {
		s.busy = map[string]int{}
	}
	s.busy[key]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.busy[key]--; s.busy[key] <= 0 {
			delete(s.busy, key)
		}
		s.mu.Unlock()
	}
}
