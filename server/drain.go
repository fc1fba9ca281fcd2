package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// closeAll closes every session of this server (CloseSessionsOnShutdown,
// C5 #ct5-close-on-shutdown) without freeing a lock its client may still
// trust: it stops extending every session, sends a lock-lost notice
// (SERVER_SHUTDOWN) for every lock it tracks, and closes a session only once
// the client acknowledged all of the session's notices, or the trust this
// server last granted it (trustUntil) ran out. Sessions still unsafe to
// close when ctx ends are left to expire, never closed early.
func (s *Server) closeAll(ctx context.Context) error {
	s.mu.Lock()
	s.closingAll = true
	s.drainWake = make(chan struct{}, 1)
	var all []*session
	for _, ss := range s.sessions {
		if !ss.known || ss.gone {
			continue
		}
		ss.closing, ss.draining = true, true
		ss.pins++
		s.unschedule(ss)
		for key, tok := range ss.locks {
			delete(ss.locks, key)
			s.noticeLocked(ss, key, tok, lockdv1.LockLostReason_LOCK_LOST_REASON_SERVER_SHUTDOWN)
		}
		all = append(all, ss)
	}
	s.mu.Unlock()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var errs []error
	for len(all) > 0 {
		ready, rest, next := s.drainReady(all)
		for _, ss := range ready {
			if err := s.closeDrained(ctx, ss); err != nil {
				errs = append(errs, err)
			}
		}
		if all = rest; len(all) == 0 {
			break
		}
		timer.Reset(time.Until(next))
		select {
		case <-s.drainWake:
			timer.Stop() // Go ≥ 1.23 timers: no stale tick to drain
		case <-timer.C:
		case <-ctx.Done():
			for _, ss := range all {
				s.unpin(ss)
			}
			return errors.Join(append(errs, fmt.Errorf("server: close sessions on shutdown: %d sessions left to expire "+
				"(their clients had neither acknowledged nor reached their deadline): %w", len(all), ctx.Err()))...)
		}
	}
	return errors.Join(errs...)
}

// drainReady splits draining sessions into those safe to close now (the
// client acknowledged every notice of a session whose grants the server
// knows, or the trust granted to it ran out) and the rest, with the earliest
// instant one of the rest becomes safe by time.
func (s *Server) drainReady(all []*session) (ready, rest []*session, next time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	next = now.Add(time.Hour)
	for _, ss := range all {
		if ss.gone || (ss.seeded && len(ss.notices) == 0) || !now.Before(ss.trustUntil) {
			ready = append(ready, ss)
			continue
		}
		rest = append(rest, ss)
		if ss.trustUntil.Before(next) {
			next = ss.trustUntil
		}
	}
	return ready, rest, next
}

// closeDrained tells the client of one drained session (pinned by
// closeAll) that it is dead — it trusts none of its locks any more — and
// closes it on the store.
func (s *Server) closeDrained(ctx context.Context, ss *session) error {
	defer s.unpin(ss)
	s.mu.Lock()
	if ss.stream != nil && !ss.gone {
		ss.stream.push(&lockdv1.KeepAliveResponse{SessionId: string(ss.id), Live: false})
	}
	s.mu.Unlock()
	if _, err := s.st.CloseSession(telemetry.WithServerClose(ctx), ss.id); err != nil {
		return fmt.Errorf("server: close session on shutdown: %w", err)
	}
	s.markGone(ss)
	return nil
}

// The graceful drain (C2 #ct2-drain, C5 #ct5-drain): a replica shutting
// down without close-sessions-on-shutdown refuses new streams, opens and
// acquires, marks every KeepAlive answer draining, pushes one draining
// notice on every open KeepAlive stream and waits until those streams have
// ended (their clients moved to another replica) or the drain timeout
// passed. It ends no session: the backend keeps each one for its TTL after
// this replica's last keepalive or heartbeat, and another replica adopts it.

// addStream registers a KeepAlive stream; false when the server drains (the
// stream is refused).
func (s *Server) addStream(ks *kaStream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining.Load() {
		return false
	}
	s.kaStreams[ks] = struct{}{}
	return true
}

// removeStream forgets an ended KeepAlive stream and wakes the drain.
func (s *Server) removeStream(ks *kaStream) {
	s.mu.Lock()
	delete(s.kaStreams, ks)
	s.mu.Unlock()
	select {
	case s.streamsGone <- struct{}{}:
	default:
	}
}

// refuseWhileDraining is the entry check of calls a draining replica no
// longer takes (OpenSession, Acquire, Watch): errShuttingDown, which the
// client retries elsewhere.
func (s *Server) refuseWhileDraining() error {
	if s.draining.Load() {
		return errShuttingDown
	}
	return nil
}

// drain tells every attached client to move and waits until every KeepAlive
// stream has ended, Config.DrainTimeout has passed, or ctx ended.
func (s *Server) drain(ctx context.Context) {
	s.mu.Lock()
	s.draining.Store(true)
	for ks := range s.kaStreams {
		ks.push(&lockdv1.KeepAliveResponse{Draining: true})
	}
	open := len(s.kaStreams)
	s.mu.Unlock()
	if open == 0 {
		return
	}
	timer := time.NewTimer(s.cfg.DrainTimeout)
	defer timer.Stop()
	for {
		select {
		case <-s.streamsGone:
			s.mu.Lock()
			open = len(s.kaStreams)
			s.mu.Unlock()
			if open == 0 {
				return
			}
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}
