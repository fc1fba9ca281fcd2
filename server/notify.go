package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"lock.dev/lockd/internal/telemetry"
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
			s.log.LogAttrs(context.Background(), slog.LevelWarn, telemetry.EventLockLossWatchFailed,
				attrError(err), attrDuration("retry_in", wait))
			if !sleepCtx(s.ctx, wait) {
				return
			}
			continue
		}
		attempt = 0
		s.tokens.watchUp() // CheckToken's cached index (tokenindex.go)
		s.reconcile()
		for ev := range ch {
			if ev.Err != nil {
				s.log.LogAttrs(context.Background(), slog.LevelWarn, telemetry.EventLockLossWatchBroke, attrError(ev.Err))
				break
			}
			if ev.Kind == store.EventResync {
				s.tokens.watchDown() // events may have been missed: empty it
				s.tokens.watchUp()
				s.reconcile() // events may have been missed
				continue
			}
			s.tokens.apply(ev)
			s.route(ev)
		}
		s.tokens.watchDown()
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
		s.sess.Untrack(ev.Session, ev.Key, ev.Token)
		return
	default:
		return
	}
	s.sess.LockLost(ev.Session, ev.Key, ev.Token, reason)
}

// reconcile compares the grants this server tracks with the backend after
// the lock-loss watch was (re-)established or resynced, and reports the
// ones that are gone.
func (s *Server) reconcile() {
	for _, t := range s.sess.TrackedLocks() {
		ctx, cancel := context.WithTimeout(s.ctx, closeTimeout)
		grants, err := s.st.LocksOf(ctx, t.ID)
		cancel()
		reason := lockdv1.LockLostReason_LOCK_LOST_REASON_UNSPECIFIED
		switch {
		case errors.Is(err, store.ErrSessionDead):
			grants, reason = nil, lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED
		case err != nil:
			if s.ctx.Err() != nil {
				return
			}
			s.log.LogAttrs(context.Background(), slog.LevelWarn, telemetry.EventLockLossReconcileFailed, attrError(err))
			continue
		}
		held := make(map[string]uint64, len(grants))
		for _, g := range grants {
			held[g.Key] = g.Token
		}
		for key, tok := range t.Locks {
			if h, ok := held[key]; !ok || h != tok {
				s.sess.LockLost(t.ID, key, tok, reason)
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
	for _, h := range s.sess.HoldersOf(key) {
		ctx, cancel := context.WithTimeout(s.ctx, closeTimeout)
		grants, err := s.st.LocksOf(ctx, h.ID)
		cancel()
		if err != nil && !errors.Is(err, store.ErrSessionDead) {
			continue // the lock-loss watch and reconcile still catch it
		}
		if !slices.ContainsFunc(grants, func(g store.Grant) bool { return g.Key == key && g.Token == h.Token }) {
			s.sess.LockLost(h.ID, key, h.Token, reason)
		}
	}
}
