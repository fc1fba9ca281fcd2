package sessions

import (
	"context"
	"errors"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// CloseMark is taken before a call asks the store about r: the silence
// closes of r begun so far, one fewer when one is in flight (its
// withdrawal may come after the store's answer).
func (t *Table) CloseMark(r *Record) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.expiring != nil {
		return r.closeGen - 1
	}
	return r.closeGen
}

// lockSettled locks t.mu once no silence close of r is in flight, and
// revives r if the backend refused that close; the caller unlocks. A reply
// that extends trust takes the lock this way, so that it either follows a
// close that ended the session (and says dead) or a refused one. It reports
// whether the store answer the call got is still good: no silence close
// began since mark (CloseMark, taken before the store call). The wait is
// bounded by CloseTimeout (and ends at Close).
func (t *Table) lockSettled(r *Record, mark uint64) (fresh bool) {
	for {
		t.mu.Lock()
		ch := r.expiring
		if ch == nil {
			t.reviveLocked(r)
			return r.closeGen == mark
		}
		t.mu.Unlock()
		<-ch
	}
}

// reviveLocked undoes the silence close of a session the backend still
// keeps (ExpireSession ended nothing, or failed): the client reached this
// server again, so it is not silent here (t.mu held, no close in flight).
// Trust is granted afterwards only from the store's answer to that call
// (grantTrustLocked). The record is watched for silence again from now, a
// TTL on (lock.session.max-ttl while an adopted session's TTL is unknown),
// also when the call extends nothing.
func (t *Table) reviveLocked(r *Record) {
	if r.state != Expiring || t.closingAll || r.expiring != nil {
		return
	}
	if !t.move(r, Live) {
		return
	}
	r.reason, r.closeAttempts = "", 0
	ttl, guess := t.silenceTTL(r)
	if at := t.now().Add(ttl); at.After(r.expireAt) {
		r.expireAt, r.expireGuess = at, guess
	}
	t.schedule(r)
}

// grantTrustLocked records that the server is about to tell the client the
// session is live for rem, counted from recv (the receipt of the request the
// reply answers; t.mu held); beat says the reply answers a heartbeat. It
// returns false, and the reply must then say the session is dead, when the
// record may not extend trust. When it returns true the silence close
// cannot happen before recv + max(ttl, rem).
func (t *Table) grantTrustLocked(r *Record, recv time.Time, rem time.Duration, beat bool) bool {
	if !t.mayExtend(r) {
		return false
	}
	if r.state == Provisional {
		// Adopted: a live session this server did not open (any replica
		// can use any session, C2 #ct2-replicas). Its TTL is unknown here.
		if !t.move(r, Live) {
			return false
		}
		r.kept, r.adopted = true, true
	}
	if r.adopted && beat && rem > r.ttl {
		// A heartbeat's Remaining is the TTL (PostgreSQL extends by it;
		// etcd proves it from a keepalive just answered), or less: a lower
		// bound of the TTL. A grant's is not (etcd reports 0 for a session
		// whose first keepalive here is still unanswered).
		r.ttl = rem
	}
	ttl, guess := t.silenceTTL(r)
	if at := recv.Add(rem); at.After(r.trustUntil) {
		r.trustUntil = at
	}
	if at := recv.Add(max(ttl, rem)); at.After(r.expireAt) || (r.expireGuess && !guess) {
		// Earlier than a guess only down to the trust granted so far.
		r.expireAt = later(at, r.trustUntil)
		r.expireGuess = guess
	}
	t.schedule(r)
	return true
}

// silenceTTL is how long r's client may stay silent here before its
// silence close: its TTL, or, while no heartbeat answered here has taught
// an adopted session's TTL, lock.session.max-ttl (guess): the client may
// have any TTL up to it, and closing it as silent after less could end a
// session whose client is calling (its first call here was a grant that
// promised nothing). The first heartbeat replaces the guess.
func (t *Table) silenceTTL(r *Record) (ttl time.Duration, guess bool) {
	if r.ttl == 0 {
		return t.cfg.MaxTTL, true
	}
	return r.ttl, false
}

// Beat records the store's answer to one heartbeat of r (lv, err: what
// the store said, after mark was taken; recv: the request's receipt) and
// fills resp. It returns the error that answers it instead of a plain
// answer (resp then carries what such an answer also carries), or answer =
// false when ctx ended and nobody is left to answer. Every answer repeats
// the session's unacknowledged lock-lost notices, and every answer of a
// session whose grants the table knows lists them (held, C2 #ct2-confirm),
// read under the same lock as the trust it grants, after the store's
// answer: a grant the table has seen go is never listed afterwards.
func (t *Table) Beat(ctx context.Context, r *Record, mark uint64, recv time.Time, lv store.Liveness, err error,
	resp *lockdv1.KeepAliveResponse) (answer bool, _ error) {
	fresh := t.lockSettled(r, mark)
	defer t.mu.Unlock()
	if !fresh && err == nil && lv.Live && r.state != Gone {
		err = ErrCloseOverlap // the answer may predate the close: extends nothing
	}
	switch {
	case ctx.Err() != nil:
		return false, nil // the caller is gone: nobody to answer
	case err == nil && lv.Live:
		switch {
		case t.grantTrustLocked(r, recv, lv.Remaining, true):
			resp.Live = true
			resp.RemainingMs = max(lv.Remaining, 0).Milliseconds()
			resp.Held = heldLocked(r)
			err = nil
		case r.state == Draining:
			// CloseAll moved r while the store was asked: answered as
			// DrainAnswer answers, never dead — a client told dead ends
			// the session and never acknowledges the notice the move
			// just pushed, and CloseAll then waits for its trust to run
			// out (issue 21, make stress 2026-12-07).
			resp.Live = true // not meaningful with an error
			resp.Held = heldLocked(r)
			err = ErrDraining
		default:
			err = nil
		}
	case err == nil || errors.Is(err, store.ErrSessionDead):
		t.markGoneLocked(r)
		err = nil
	default:
		resp.Live = true // not meaningful with an error; never read as dead
		resp.Held = heldLocked(r)
	}
	resp.Lost = pendingLocked(r)
	return true, err
}

// GrantOutcome is what Grant decided about a grant the store made.
type GrantOutcome uint8

const (
	// Granted: the reply may say granted; the grant is tracked unless it
	// went away meanwhile.
	Granted GrantOutcome = iota
	// GrantOverlapped: the grant overlapped a silence close of the
	// session here (ErrCloseOverlap): retryable, it extends nothing.
	GrantOverlapped
	// GrantEnding: the session is ending, which takes the grant with it
	// (store.ErrSessionDead).
	GrantEnding
)

// Grant records a grant the store made to r (g; recv: the receipt of the
// Acquire; mark: CloseMark before the store was asked) and decides the
// reply. A tracked grant leaves slot's in-progress count in the same
// critical section, so a grant counts once — as held — from that instant
// (C2 #ct2-limits, LIM-1).
func (t *Table) Grant(r *Record, mark uint64, recv time.Time, g store.Grant, slot *Slot) GrantOutcome {
	fresh := t.lockSettled(r, mark)
	defer t.mu.Unlock()
	if !fresh && r.state != Gone {
		return GrantOverlapped
	}
	if !t.grantTrustLocked(r, recv, g.Remaining, false) {
		return GrantEnding
	}
	// Not tracked when the grant went away before this reply (a lock-lost
	// notice is then on its way, and no answer confirms it).
	if t.trackLocked(r, g.Key, g.Token) {
		if r.grantedAt == nil {
			r.grantedAt = map[string]time.Time{}
		}
		if _, ok := r.grantedAt[g.Key]; !ok { // an Acquire of a held key keeps its first answer
			r.grantedAt[g.Key] = t.now()
		}
		if slot != nil {
			slot.heldLocked()
		}
	}
	return Granted
}

// ErrDraining answers a heartbeat of a session CloseAll is closing (its
// store answer came after the move to Draining): the caller answers with
// SHUTTING_DOWN, as after DrainAnswer.
var ErrDraining = errors.New("sessions: the session is being closed on shutdown")

// DrainAnswer fills resp for a session that CloseAll is about to close (no
// extension, its held set and pending notices; the caller answers with
// SHUTTING_DOWN) and reports whether it did. A record Ending reported
// ending may have moved to Draining since: ask DrainAnswer again before
// answering dead.
func (t *Table) DrainAnswer(r *Record, resp *lockdv1.KeepAliveResponse) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.state != Draining {
		return false
	}
	resp.Live = true // not meaningful with an error
	resp.Held = heldLocked(r)
	resp.Lost = pendingLocked(r)
	return true
}
