package server

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"time"

	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// maxPendingNotices bounds the unacknowledged lock-lost notices kept for a
// session (the oldest are dropped; the held set still ends the client's
// trust in those locks, C2 #ct2-confirm).
const maxPendingNotices = 1024

// maxGoneKeys bounds the per-session memory of grants gone while a grant or
// a seeding read is in flight (session.goneTok); beyond it every such grant
// is refused tracking, which only makes its client drop the lock.
const maxGoneKeys = 4096

// closeRetry bounds the backoff between attempts to close a silent session
// when the backend refuses.
const (
	closeRetryMin = 200 * time.Millisecond
	closeRetryMax = 5 * time.Second
	closeTimeout  = 10 * time.Second
)

// session is the server's record of one session. All fields are guarded by
// Server.mu.
//
// The record enforces the rule for closing a silent client (docs/safety.md,
// "What the server may and may not do"; C2 #ct2-deadline): every reply that
// extends the client's trust (open, heartbeat, grant) is sent only after
// grantTrust moved expireAt to at least (receipt of the request) + max(ttl,
// Remaining granted), and only if the record is not closing. The silence
// closer closes a session only when expireAt has passed, and marks it closing
// first, under the same mutex. So the server never closes a session whose
// client may still trust it, and never tells a client "live" about a session
// it is closing.
type session struct {
	id  store.SessionID
	ttl time.Duration
	// known: the session was opened here or the store confirmed it live.
	// A record that is not known is provisional: it exists only while an
	// RPC pins it, and is not watched for silence.
	known bool
	// closing: the server decided to end the session (silence, CloseSession,
	// shutdown). Every later trust-extending reply says dead — except after
	// a silence close the backend refused (reason set, expiring nil): a call
	// that reaches this server then revives the record (reviveLocked).
	closing bool
	// expiring is non-nil while the silence loop's close of the session is
	// in flight; it is closed once the outcome is recorded. A reply that
	// would extend trust waits for it (lockSettled).
	expiring chan struct{}
	// closeGen counts the silence closes begun (closeSilent): a call whose
	// store answer overlapped one extends nothing (closeMark, lockSettled).
	closeGen uint64
	// gone: the store confirmed the session dead or closed.
	gone bool
	// closeAttempts counts failed silence-close attempts (backoff).
	closeAttempts int
	// reason is the session_lost reason of a close by the silence loop;
	// empty for a close the client asked for (CloseSession) that the loop
	// retries. A silence close is the backend's decision (ExpireSession),
	// so a record closing with a reason is revived by the next call that
	// reaches this server while the backend keeps the session.
	reason string
	// closeBy and closeRule are who asked for a close that the silence
	// loop retries (reason empty), for session_closed (C4 #ct4-audit);
	// closeCaller says they are set.
	closeBy, closeRule string
	closeCaller        bool
	// expireAt is the monotonic instant after which the client has been
	// silent long enough to be closed.
	expireAt time.Time
	// adopted: the session was not opened here; ttl is then learned from
	// heartbeat answers (a lower bound of the TTL), 0 until the first.
	adopted bool
	// expireGuess: expireAt rests on lock.session.max-ttl standing in for
	// an adopted session's TTL not learned yet (grantTrustLocked).
	expireGuess bool
	// heapAt is where the record sits in the silence heap: never later
	// than expireAt. An extension of expireAt leaves it in place; the
	// silence loop files the record again when heapAt comes (schedule).
	heapAt  time.Time
	heapIdx int // index in Server.silence, -1 when not in it
	pins    int // RPCs in flight that use this record
	// stream is the KeepAlive stream the latest heartbeat came on.
	stream *kaStream
	// locks are the session's grants as this server knows them, key →
	// token: grants made through it, and for an adopted session those read
	// from the store when it was seeded. Lock-lost notices are routed by
	// them and heartbeat answers confirm exactly them (C2 #ct2-confirm).
	locks map[string]uint64
	// seeded: locks is complete (the session was opened here, or its
	// grants were read from the store after it was adopted).
	seeded bool
	// reading counts grants and seeding reads in flight: while it is
	// positive, goneTok remembers, per key, the highest token gone
	// (released, revoked, lost), so a grant or read that raced with the
	// loss is not tracked afterwards. Cleared when reading drops to 0.
	reading      int
	goneTok      map[string]uint64
	goneOverflow bool
	// notices are the lock-lost notices the client has not acknowledged,
	// oldest first.
	notices []*lockdv1.LockLost
	// trustUntil is the latest (receipt + Remaining) this server granted:
	// the client trusts nothing of the session beyond it.
	trustUntil time.Time
	// secretHash is the SHA-256 of the session's secret (secret.go), set
	// at open or when first read from the store; nil when not known yet.
	secretHash []byte
	// principal is the principal the session is bound to (principal.go),
	// "" for none; valid when principalKnown.
	principal      string
	principalKnown bool
	// draining: Shutdown with close-sessions-on-shutdown waits for the
	// client to acknowledge its notices (or trustUntil) before closing.
	draining bool
}

// silenceHeap orders known, live sessions by heapAt (a lower bound of
// expireAt): the one owned goroutine (silenceLoop) sleeps until the
// earliest one.
type silenceHeap []*session

func (h silenceHeap) Len() int           { return len(h) }
func (h silenceHeap) Less(i, j int) bool { return h[i].heapAt.Before(h[j].heapAt) }
func (h silenceHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *silenceHeap) Push(x any) {
	x.(*session).heapIdx = len(*h)
	*h = append(*h, x.(*session))
}
func (h *silenceHeap) Pop() any {
	old := *h
	n := len(old)
	x := old[n-1]
	old[n-1] = nil
	x.heapIdx = -1
	*h = old[:n-1]
	return x
}

// schedule puts ss in the silence heap at its expireAt (s.mu held) and wakes
// the silence loop when it became the earliest. A record already in the heap
// whose expireAt only moved later (every heartbeat and grant) stays where it
// is: the silence loop finds the later expireAt when the record comes up and
// files it again, so a heartbeat costs no heap operation.
func (s *Server) schedule(ss *session) {
	if ss.heapIdx >= 0 {
		if !ss.expireAt.Before(ss.heapAt) {
			return
		}
		ss.heapAt = ss.expireAt
		heap.Fix(&s.silence, ss.heapIdx)
	} else {
		ss.heapAt = ss.expireAt
		heap.Push(&s.silence, ss)
	}
	if ss.heapIdx == 0 {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// unschedule removes ss from the silence heap (s.mu held).
func (s *Server) unschedule(ss *session) {
	if ss.heapIdx >= 0 {
		heap.Remove(&s.silence, ss.heapIdx)
	}
}

// register records a session just opened here (recv: when OpenSession was
// received).
func (s *Server) register(sess store.Session, recv time.Time, secretHash []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closingAll {
		return false
	}
	ss := &session{id: sess.ID, ttl: sess.TTL, known: true, seeded: true, heapIdx: -1, locks: map[string]uint64{}, secretHash: secretHash,
		expireAt: recv.Add(max(sess.TTL, sess.Remaining)), trustUntil: recv.Add(sess.Remaining)}
	s.sessions[sess.ID] = ss
	s.schedule(ss)
	return true
}

// pin returns the record of id, creating a provisional one, and keeps it
// from being dropped until unpin.
func (s *Server) pin(id store.SessionID) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pinLocked(id)
}

// pinUse is pin for a request that may grant a lock: it also reports
// whether the session is ending (endingLocked), under the same lock, and
// begins a read (beginReadLocked) that the caller ends with endRead.
func (s *Server) pinUse(id store.SessionID) (*session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.pinLocked(id)
	s.beginReadLocked(ss)
	return ss, s.endingLocked(ss)
}

// endingLocked reports whether ss is being ended for good (s.mu held): the
// store said it is gone, its client or an operator closed it, or a
// shutdown closes every session. A silence close is not final here: only
// the backend ends a session a client fell silent on (ExpireSession, C2
// #ct2-replicas), and a call that reaches this server shows its client is
// not silent here any more (reviveLocked) — on several replicas the client
// may have talked to another one all along.
func (s *Server) endingLocked(ss *session) bool {
	return ss.gone || s.closingAll || (ss.closing && ss.reason == "")
}

// closeMark is taken before a call asks the store about ss: the silence
// closes of ss begun so far, one fewer when one is in flight (its
// withdrawal may come after the store's answer).
func (s *Server) closeMark(ss *session) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.expiring != nil {
		return ss.closeGen - 1
	}
	return ss.closeGen
}

// errCloseOverlap answers a call whose store answer overlapped a silence
// close of its session on this replica (C2 #ct2-replicas): retryable, it
// extends nothing; the retry adopts the session again.
var errCloseOverlap = fmt.Errorf("%w: the session's silence close on this replica overlapped the call; retry", store.ErrContention)

// lockSettled locks s.mu once no silence close of ss is in flight, and
// revives ss if the backend refused that close; the caller unlocks. A
// reply that extends trust takes the lock this way, so that it either
// follows a close that ended the session (and says dead) or a refused one.
// It reports whether the store answer the call got is still good: no
// silence close began since mark (closeMark, taken before the store call).
// The wait is bounded by closeTimeout (and ends at Shutdown).
func (s *Server) lockSettled(ss *session, mark uint64) (fresh bool) {
	for {
		s.mu.Lock()
		ch := ss.expiring
		if ch == nil {
			s.reviveLocked(ss)
			return ss.closeGen == mark
		}
		s.mu.Unlock()
		<-ch
	}
}

// reviveLocked undoes the silence close of a session the backend still
// keeps (ExpireSession ended nothing, or failed): the client reached this
// server again, so it is not silent here (s.mu held, no close in flight).
// Trust is granted afterwards only from the store's answer to that call
// (grantTrustLocked). The record is watched for silence again from now, a
// TTL on (lock.session.max-ttl while an adopted session's TTL is unknown),
// also when the call extends nothing.
func (s *Server) reviveLocked(ss *session) {
	if !ss.closing || ss.reason == "" || ss.gone || s.closingAll || ss.draining || ss.expiring != nil {
		return
	}
	ss.closing, ss.reason, ss.closeAttempts = false, "", 0
	ttl, guess := s.silenceTTL(ss)
	if at := time.Now().Add(ttl); at.After(ss.expireAt) {
		ss.expireAt, ss.expireGuess = at, guess
	}
	s.schedule(ss)
}

// endRead ends the read pinUse began.
func (s *Server) endRead(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endReadLocked(ss)
}

func (s *Server) pinLocked(id store.SessionID) *session {
	ss := s.sessions[id]
	if ss == nil {
		ss = &session{id: id, heapIdx: -1, locks: map[string]uint64{}}
		s.sessions[id] = ss
	}
	ss.pins++
	return ss
}

// unpin releases a pin; an unpinned record that is provisional or gone is
// dropped.
func (s *Server) unpin(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss.pins--
	s.dropIfDone(ss)
}

// dropIfDone removes ss from the table when nothing needs it (s.mu held).
func (s *Server) dropIfDone(ss *session) {
	if ss.pins > 0 || (ss.known && !ss.gone) {
		return
	}
	s.unschedule(ss)
	if ss.stream != nil {
		ss.stream.sessions--
		ss.stream = nil
	}
	if s.sessions[ss.id] == ss {
		delete(s.sessions, ss.id)
	}
	ss.locks = nil
	ss.notices = nil
	ss.goneTok = nil
}

// grantTrustLocked records that the server is about to tell the client the
// session is live for rem, counted from recv (the receipt of the request the
// reply answers; s.mu held); beat says the reply answers a heartbeat. It
// returns false, and the reply must then say the session is dead, when the
// session is closing. When it returns true the silence close cannot happen
// before recv + max(ttl, rem).
func (s *Server) grantTrustLocked(ss *session, recv time.Time, rem time.Duration, beat bool) bool {
	if ss.closing || ss.gone || s.closingAll {
		return false
	}
	if !ss.known {
		// Adopted: a live session this server did not open (any replica
		// can use any session, C2 #ct2-replicas). Its TTL is unknown here.
		ss.known, ss.adopted = true, true
	}
	if ss.adopted && beat && rem > ss.ttl {
		// A heartbeat's Remaining is the TTL (PostgreSQL extends by it;
		// etcd proves it from a keepalive just answered), or less: a lower
		// bound of the TTL. A grant's is not (etcd reports 0 for a session
		// whose first keepalive here is still unanswered).
		ss.ttl = rem
	}
	ttl, guess := s.silenceTTL(ss)
	if at := recv.Add(rem); at.After(ss.trustUntil) {
		ss.trustUntil = at
	}
	if at := recv.Add(max(ttl, rem)); at.After(ss.expireAt) || (ss.expireGuess && !guess) {
		// Earlier than a guess only down to the trust granted so far.
		ss.expireAt = later(at, ss.trustUntil)
		ss.expireGuess = guess
	}
	s.schedule(ss)
	return true
}

// silenceTTL is how long ss's client may stay silent here before its
// silence close: its TTL, or, while no heartbeat answered here has taught
// an adopted session's TTL, lock.session.max-ttl (guess): the client may
// have any TTL up to it, and closing it as silent after less could end a
// session whose client is calling (its first call here was a grant that
// promised nothing). The first heartbeat replaces the guess.
func (s *Server) silenceTTL(ss *session) (ttl time.Duration, guess bool) {
	if ss.ttl == 0 {
		return s.cfg.MaxTTL, true
	}
	return ss.ttl, false
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// markGone records that the store reports the session dead or closed.
func (s *Server) markGone(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.markGoneLocked(ss)
}

func (s *Server) markGoneLocked(ss *session) {
	if ss.gone {
		return
	}
	ss.gone = true
	ss.closing = true
	s.unschedule(ss)
	s.dropIfDone(ss)
}

// beginClose marks ss closing so that no later reply extends trust: its
// client asked, which no later call revives.
func (s *Server) beginClose(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss.closing, ss.reason = true, ""
	s.unschedule(ss)
}

// refileAhead is how far ahead of their heapAt the silence loop files
// extended records again, so that one wake-up refiles a second's worth of
// them instead of waking once per record.
const refileAhead = time.Second

// silenceLoop is the one goroutine that closes sessions whose clients fell
// silent. It sleeps until the earliest expireAt in the heap and exits when
// the server's context ends (Shutdown).
func (s *Server) silenceLoop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		now := time.Now()
		var due []*session
		for len(s.silence) > 0 && !s.silence[0].heapAt.After(now.Add(refileAhead)) {
			if first := s.silence[0]; first.expireAt.After(now) {
				if !first.heapAt.Before(first.expireAt) {
					break // filed at its expireAt, which is still to come
				}
				// Extended since it was filed: file it at its expireAt.
				first.heapAt = first.expireAt
				heap.Fix(&s.silence, 0)
				continue
			}
			ss := heap.Pop(&s.silence).(*session)
			if !ss.closing {
				ss.closing = true
				ss.reason = telemetry.LostClientSilent
			}
			ss.pins++ // held by the close below
			due = append(due, ss)
		}
		wait := time.Hour
		if len(s.silence) > 0 {
			wait = s.silence[0].heapAt.Sub(now)
		}
		s.mu.Unlock()

		for _, ss := range due {
			s.closeSilent(ss)
		}
		if len(due) > 0 {
			continue // closing took time: look again before sleeping
		}
		timer.Reset(wait)
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
			timer.Stop() // Go ≥ 1.23 timers: no stale tick to drain
		case <-timer.C:
		}
	}
}

// closeSilent closes a session whose client fell silent (ss pinned and
// closing, its close in flight: expiring). On failure it is rescheduled
// with backoff; the record stays closing, so no reply extends trust
// meanwhile unless a call revives it (reviveLocked).
func (s *Server) closeSilent(ss *session) {
	s.mu.Lock()
	if !ss.closing {
		// Revived since it was filed: a call reached this server and
		// filed it again (reviveLocked, grantTrustLocked).
		ss.pins--
		s.dropIfDone(ss)
		s.mu.Unlock()
		return
	}
	ss.expiring = make(chan struct{})
	ss.closeGen++
	reason := ss.reason // read under s.mu: CloseSession may clear it meanwhile
	s.mu.Unlock()
	defer s.settled(ss)
	if s.ctx.Err() != nil {
		s.unpin(ss)
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, closeTimeout)
	var (
		n       int
		err     error
		already bool // the session was gone before: whoever ended it counted the loss
	)
	if reason == "" {
		// The client asked: unconditional, recorded as the caller's close.
		cctx := telemetry.WithServerClose(ctx)
		s.mu.Lock()
		if ss.closeCaller {
			cctx = telemetry.WithCaller(ctx, ss.closeBy, ss.closeRule)
		}
		s.mu.Unlock()
		n, err = s.st.CloseSession(cctx, ss.id)
	} else {
		// Silence: only the backend may say the session is over (C2
		// #ct2-replicas); another replica may be keeping it alive.
		var ex store.Expiry
		ex, err = s.st.ExpireSession(ctx, ss.id)
		if already = errors.Is(err, store.ErrSessionDead); already {
			err = nil
		} else if err == nil && !ex.Ended {
			cancel()
			s.retrySilent(ss, ex.Remaining)
			return
		}
		n = ex.Released
	}
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	ss.pins--
	if err != nil {
		if s.ctx.Err() != nil {
			s.dropIfDone(ss)
			return
		}
		ss.closeAttempts++
		backoff := min(closeRetryMin<<min(ss.closeAttempts, 10), closeRetryMax)
		s.log.LogAttrs(context.Background(), slogWarn, "closing silent session failed",
			attrError(err), attrDuration("retry_in", backoff))
		ss.expireAt = time.Now().Add(backoff)
		s.schedule(ss)
		return
	}
	if reason != "" && !already {
		s.tlog.SessionLost(ss.id, reason)
		s.metrics.SessionLost(reason)
	}
	_ = n // the store logs and counts the released locks
	if ss.stream != nil {
		ss.stream.push(&lockdv1.KeepAliveResponse{SessionId: string(ss.id), Live: false})
	}
	s.markGoneLocked(ss)
}

// settled ends the in-flight mark of a silence close: its outcome is
// recorded, replies waiting in lockSettled go on.
func (s *Server) settled(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.expiring != nil {
		close(ss.expiring)
		ss.expiring = nil
	}
}

// retrySilent files a silent session again for when the backend's expiry
// comes: ExpireSession found it still alive (its expiry is just ahead, or
// another replica keeps it). The record stays closing, so this server
// extends nobody's trust in it meanwhile.
// ss is pinned by the caller; the pin is released here.
func (s *Server) retrySilent(ss *session, rem time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss.pins--
	if ss.gone || s.ctx.Err() != nil {
		s.dropIfDone(ss)
		return
	}
	ss.closeAttempts = 0
	ss.expireAt = time.Now().Add(max(rem-expireEarly, 0))
	s.schedule(ss)
}

// expireEarly: a silent session is filed again this much before its
// backend expiry, so the store can wait for the expiry itself (pgstore
// waits up to 50 ms) and end the session before the reaper does.
const expireEarly = 25 * time.Millisecond
