package server

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

const (
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = 5 * time.Second
)

// lostLoop is the one goroutine that tells holders their locks are gone. It
// keeps one store.WatchFrom of every key from now open and routes revoked
// and expired events, by session, key and token, to the session's
// KeepAlive stream. When the watch breaks it re-establishes it, and when
// the store says events may have been missed (a resync: etcd compacted the
// watch's history under it, C2 #ct2-watch-resume) it goes on; either way it
// reconciles the grants it tracks against the backend. It exits when the
// server's context ends (Shutdown).
func (s *Server) lostLoop() {
	defer s.wg.Done()
	attempt := 0
	for {
		_, ch, err := s.st.WatchFrom(s.ctx, "", "")
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			attempt++
			wait := min(watchRetryMin<<min(attempt, 10), watchRetryMax)
			s.log.LogAttrs(context.Background(), slog.LevelWarn, "lock-loss watch failed",
				attrError(err), attrDuration("retry_in", wait))
			if !sleepCtx(s.ctx, wait) {
				return
			}
			continue
		}
		attempt = 0
		s.reconcile()
		for ev := range ch {
			if ev.Err != nil {
				s.log.LogAttrs(context.Background(), slog.LevelWarn, "lock-loss watch broke", attrError(ev.Err))
				break
			}
			if ev.Kind == store.EventResync {
				s.reconcile() // events may have been missed
				continue
			}
			s.route(ev)
		}
		if s.ctx.Err() != nil {
			return
		}
	}
}

// route delivers one backend event to the holder, if the holder is a session
// of this server that the event takes a lock from.
func (s *Server) route(ev store.Event) {
	if quiet(ev) { // liveness.go
		return
	}
	var reason lockdv1.LockLostReason
	switch ev.Kind {
	case store.EventRevoked:
		reason = lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED
	case store.EventExpired:
		reason = lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED
	case store.EventMaxHold:
		reason = lockdv1.LockLostReason_LOCK_LOST_REASON_MAX_HOLD
	case store.EventReleased:
		s.untrack(ev.Session, ev.Key, ev.Token)
		return
	default:
		return
	}
	s.lockLost(ev.Session, ev.Key, ev.Token, reason)
}

// beginRead marks a grant or a seeding read of ss in flight (s.mu held):
// until endRead, grants that go are remembered in goneTok.
func (s *Server) beginReadLocked(ss *session) {
	ss.reading++
}

// endRead ends what beginRead began (s.mu held).
func (s *Server) endReadLocked(ss *session) {
	ss.reading--
	if ss.reading <= 0 {
		ss.reading = 0
		ss.goneTok, ss.goneOverflow = nil, false
	}
}

// trackLocked records a grant of ss (s.mu held), unless a grant of the key
// with this token or a later one went away while it was in flight: a late
// grant reply or store read never revives a lost grant. It reports whether
// the grant is tracked.
func (s *Server) trackLocked(ss *session, key string, token uint64) bool {
	if ss.locks == nil || ss.goneOverflow || token <= ss.goneTok[key] {
		return false
	}
	if tok, ok := ss.locks[key]; ok && tok > token {
		return false // a newer grant of the key is tracked
	}
	ss.locks[key] = token
	return true
}

// goneLocked records that (key, token) of ss went away and forgets it if
// tracked (s.mu held). It returns the tracked token that went (at most
// token: a session holds one grant of a key at a time, and tokens of a key
// only rise, so an older tracked grant is gone too) and whether there was
// one.
func (s *Server) goneLocked(ss *session, key string, token uint64) (uint64, bool) {
	if ss.reading > 0 && token > ss.goneTok[key] {
		if ss.goneTok == nil {
			ss.goneTok = map[string]uint64{}
		}
		if len(ss.goneTok) >= maxGoneKeys {
			ss.goneOverflow = true
		} else {
			ss.goneTok[key] = token
		}
	}
	tok, ok := ss.locks[key]
	if !ok || tok > token {
		return 0, false
	}
	delete(ss.locks, key)
	return tok, true
}

// untrack forgets a grant released through any instance.
func (s *Server) untrack(id store.SessionID, key string, token uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss := s.sessions[id]; ss != nil {
		s.goneLocked(ss, key, token)
	}
}

// heldLocked is the session's held set for a heartbeat answer (s.mu held):
// nil when the server does not know all its grants.
func (s *Server) heldLocked(ss *session) *lockdv1.HeldLocks {
	if !ss.seeded || ss.locks == nil {
		return nil
	}
	h := &lockdv1.HeldLocks{Locks: make([]*lockdv1.HeldLock, 0, len(ss.locks))}
	for k, tok := range ss.locks {
		h.Locks = append(h.Locks, &lockdv1.HeldLock{Key: k, Token: tok})
	}
	return h
}

// lockLost tells the holder session that it lost (key, token).
func (s *Server) lockLost(id store.SessionID, key string, token uint64, reason lockdv1.LockLostReason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[id]
	if ss == nil {
		return
	}
	tok, ok := s.goneLocked(ss, key, token)
	if !ok {
		return
	}
	if tok != token {
		reason = lockdv1.LockLostReason_LOCK_LOST_REASON_UNSPECIFIED
	}
	s.noticeLocked(ss, key, tok, reason)
}

// noticeLocked queues a lock-lost notice for ss until the client
// acknowledges it, and pushes it on the session's stream at once (s.mu
// held). Every heartbeat answer repeats the unacknowledged notices, so a
// push lost on the way is delivered with the next answer.
func (s *Server) noticeLocked(ss *session, key string, token uint64, reason lockdv1.LockLostReason) {
	s.noticeSeq++
	notice := &lockdv1.LockLost{Key: key, Token: token, Reason: reason, NoticeId: s.noticeSeq}
	ss.notices = append(ss.notices, notice)
	if over := len(ss.notices) - maxPendingNotices; over > 0 {
		ss.notices = ss.notices[over:]
		s.log.LogAttrs(context.Background(), slog.LevelWarn, "lock-loss notices dropped", slog.Int("dropped", over))
	}
	// A silence close the backend may still refuse is not an end
	// (endingLocked): a push never extends trust, so live is safe to say.
	live := reason != lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED && !ss.gone &&
		(ss.draining || !s.endingLocked(ss))
	if ss.stream != nil {
		ss.stream.push(&lockdv1.KeepAliveResponse{SessionId: string(ss.id), Live: live,
			Lost: []*lockdv1.LockLost{notice}})
	}
}

// ackLocked drops the notices of ss the client acknowledged (s.mu held) and
// wakes a draining Shutdown.
func (s *Server) ackLocked(ss *session, ids []uint64) {
	if len(ids) == 0 || len(ss.notices) == 0 {
		return
	}
	acked := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		acked[id] = true
	}
	kept := ss.notices[:0]
	for _, n := range ss.notices {
		if !acked[n.NoticeId] {
			kept = append(kept, n)
		}
	}
	clear(ss.notices[len(kept):])
	ss.notices = kept
	if s.drainWake != nil {
		select {
		case s.drainWake <- struct{}{}:
		default:
		}
	}
}

// pendingLocked returns a copy of the unacknowledged notices of ss (s.mu
// held).
func (s *Server) pendingLocked(ss *session) []*lockdv1.LockLost {
	if len(ss.notices) == 0 {
		return nil
	}
	return append([]*lockdv1.LockLost(nil), ss.notices...)
}

// reconcile compares the grants this server tracks with the backend after
// the lock-loss watch was (re-)established or resynced, and reports the
// ones that are gone.
func (s *Server) reconcile() {
	type tracked struct {
		id    store.SessionID
		locks map[string]uint64
	}
	var snap []tracked
	s.mu.Lock()
	for id, ss := range s.sessions {
		if len(ss.locks) > 0 && !ss.gone {
			snap = append(snap, tracked{id: id, locks: maps.Clone(ss.locks)})
		}
	}
	s.mu.Unlock()
	for _, t := range snap {
		ctx, cancel := context.WithTimeout(s.ctx, closeTimeout)
		grants, err := s.st.LocksOf(ctx, t.id)
		cancel()
		reason := lockdv1.LockLostReason_LOCK_LOST_REASON_UNSPECIFIED
		switch {
		case errors.Is(err, store.ErrSessionDead):
			grants, reason = nil, lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED
		case err != nil:
			if s.ctx.Err() != nil {
				return
			}
			s.log.LogAttrs(context.Background(), slog.LevelWarn, "lock-loss reconcile failed", attrError(err))
			continue
		}
		held := make(map[string]uint64, len(grants))
		for _, g := range grants {
			held[g.Key] = g.Token
		}
		for key, tok := range t.locks {
			if h, ok := held[key]; !ok || h != tok {
				s.lockLost(t.id, key, tok, reason)
			}
		}
	}
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// recheckHolders reads from the store the grants of every session of this
// server that holds key and tells those whose grant of key is gone that
// they lost it (for reason). A semaphore or read/write key has several
// holders (C2 #ct2-multi); Revoke takes them all but returns one.
func (s *Server) recheckHolders(key string, reason lockdv1.LockLostReason) {
	type holder struct {
		id  store.SessionID
		tok uint64
	}
	var hs []holder
	s.mu.Lock()
	for id, ss := range s.sessions {
		if tok, ok := ss.locks[key]; ok && !ss.gone {
			hs = append(hs, holder{id, tok})
		}
	}
	s.mu.Unlock()
	for _, h := range hs {
		ctx, cancel := context.WithTimeout(s.ctx, closeTimeout)
		grants, err := s.st.LocksOf(ctx, h.id)
		cancel()
		if err != nil && !errors.Is(err, store.ErrSessionDead) {
			continue // the lock-loss watch and reconcile still catch it
		}
		if !slices.ContainsFunc(grants, func(g store.Grant) bool { return g.Key == key && g.Token == h.tok }) {
			s.lockLost(h.id, key, h.tok, reason)
		}
	}
}
