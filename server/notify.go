package server

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

const (
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = 5 * time.Second
)

// lostLoop is the one goroutine that tells holders their locks are gone. It
// keeps one store.Watch("") open and routes revoked and expired events, by
// session, key and token, to the session's KeepAlive stream. When the watch
// breaks it re-establishes it and reconciles the grants it tracks against
// the backend, since events may have been missed. It exits when the server's
// context ends (Shutdown).
func (s *Server) lostLoop() {
	defer s.wg.Done()
	attempt := 0
	for {
		ch, err := s.st.Watch(s.ctx, "")
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
	var reason lockdv1.LockLostReason
	switch ev.Kind {
	case store.EventRevoked:
		reason = lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED
	case store.EventExpired:
		reason = lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED
	case store.EventReleased:
		s.untrack(ev.Session, ev.Key, ev.Token)
		return
	default:
		return
	}
	s.lockLost(ev.Session, ev.Key, ev.Token, reason)
}

// track records a grant made through this server (s.mu held).
func (s *Server) trackLocked(ss *session, key string, token uint64) {
	ss.locks[key] = token
}

// untrack forgets a grant (released through any instance); it reports
// whether the grant was tracked.
func (s *Server) untrack(id store.SessionID, key string, token uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.untrackLocked(id, key, token)
}

func (s *Server) untrackLocked(id store.SessionID, key string, token uint64) bool {
	ss := s.sessions[id]
	if ss == nil || ss.locks == nil {
		return false
	}
	if tok, ok := ss.locks[key]; !ok || tok != token {
		return false
	}
	delete(ss.locks, key)
	return true
}

// lockLost tells the holder session that it lost (key, token), once.
func (s *Server) lockLost(id store.SessionID, key string, token uint64, reason lockdv1.LockLostReason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.untrackLocked(id, key, token) {
		return
	}
	ss := s.sessions[id]
	notice := &lockdv1.LockLost{Key: key, Token: token, Reason: reason}
	live := reason != lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED && !ss.closing && !ss.gone
	if ss.stream != nil && ss.stream.push(&lockdv1.KeepAliveResponse{SessionId: string(id), Live: live,
		Lost: []*lockdv1.LockLost{notice}}) {
		return
	}
	ss.pending = append(ss.pending, notice)
	if over := len(ss.pending) - maxPendingNotices; over > 0 {
		ss.pending = ss.pending[over:]
		s.log.LogAttrs(context.Background(), slog.LevelWarn, "lock-loss notices dropped", slog.Int("dropped", over))
	}
}

// reconcile compares the grants this server tracks with the backend after
// the lock-loss watch was (re-)established, and reports the ones that are
// gone.
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
