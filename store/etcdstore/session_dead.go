package etcdstore

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// pruneDead forgets sessions dead for longer than deadRetention; the
// keeper calls it about once a minute.
func (s *Store) pruneDead(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, ss := range s.sessions {
		if ss.dead && now.Sub(ss.deadAt) > deadRetention {
			delete(s.sessions, id)
		}
	}
	for id, u := range s.unsure {
		if now.Sub(u.since) > deadRetention {
			s.dropUnsureLocked(id) // never asked again: no longer this Store's
		}
	}
}

// markDead makes a live session dead for reason (see markDeadLocked). The
// keeper reports a lease it found gone or can no longer show alive here.
func (s *Store) markDead(ss *session, reason string) {
	s.mu.Lock()
	s.markDeadLocked(ss, reason)
	s.mu.Unlock()
}

// markDeadLocked makes a live session dead for reason (a C4 lost reason):
// terminal. Its keepalives stop. When the lease may still exist
// (keepalive_failed), it is revoked in the background once etcd answers. A
// lease found gone (lease_expired) may have been ended by another Store,
// which recorded the end: the loss is recorded in the background, only if
// this Store's claim of the end wins (end.go, C4 #ct4-replica-count).
func (s *Store) markDeadLocked(ss *session, reason string) {
	if ss.dead {
		return
	}
	ss.dead, ss.deadAt = true, time.Now()
	close(ss.done)
	stopHoldLocked(ss, "")
	s.keep.remove(ss) // its lock-delay companions are no longer kept either (delay.go)
	held := ss.held
	ss.held, ss.queued = nil, nil
	if reason == telemetry.LostLeaseExpired && !s.closed {
		s.wg.Add(1)
		go s.recordFoundGone(ss, held) // exits after one claim, bounded by claimTimeout
		return
	}
	s.recordLost(ss, reason, held)
	if reason != telemetry.LostLeaseExpired && !s.closed {
		s.wg.Add(1)
		go s.revokeLater(ss) // exits after success, lease gone, Close, or ttl+2s
	}
}

// releaseHeldLocked logs and counts the session's cached grants as released.
func (s *Store) releaseHeldLocked(ss *session, reason string) {
	for k, tok := range ss.held {
		s.log.LockReleased(store.Grant{Key: k, Session: ss.id, Token: tok}, reason)
	}
	s.met.Released(reason, len(ss.held))
	ss.held, ss.queued = nil, nil
}

// revokeLater ends a session given up on (its keepalives failed), retrying
// while etcd is unreachable, but only as ExpireSession would: if no other
// Store keeps it (C2 #ct2-replicas), so a session another replica serves
// is never revoked; this Store's keeper record is withdrawn either way.
// After ttl+2s there is no point: without keepalives of this Store the
// lease has expired by then, or another keeps it.
func (s *Store) revokeLater(ss *session) {
	defer s.wg.Done()
	deadline := time.Now().Add(ss.ttl + 2*time.Second)
	delay := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(s.ctx, time.Second)
		ended, _, err := s.endIfUnkept(ctx, ss.id, ss.keeperRev)
		if err == nil && ended {
			_, err = s.cli.Revoke(ctx, ss.lease)
		}
		cancel()
		if err == nil || errors.Is(classify(context.Background(), err), store.ErrSessionDead) || time.Now().After(deadline) {
			return
		}
		t := time.NewTimer(delay)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}

// revokeNow revokes a lease right away, best effort (OpenSession racing
// Close).
func (s *Store) revokeNow(lease clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.cli.Revoke(ctx, lease) //nolint:errcheck // best effort: the lease expires anyway
}
