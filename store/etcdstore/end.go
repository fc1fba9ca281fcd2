package etcdstore

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Which Store records a session's end (C4 #ct4-replica-count, issue 21).
// Several Stores may keep one session (C2 #ct2-replicas) and each learns
// when it ends, but exactly one logs and counts the end (session_closed or
// session_lost, lock_released, the release, lost and expired counters): the
// one whose operation ended it. That Store claims the end with an end
// marker e/<id>, created only if absent, on the current release-marker
// lease (marker.go): CloseSession before its revoke; ExpireSession in the
// transaction that deletes the session record, which ends nothing while
// another Store's marker is there (that Store's close is under way and
// records the end; without this, a close whose Store stopped keeping the
// session meanwhile found the lease revoked under it and recorded the end
// a second time). A Store that finds the lease gone by itself (its keeper,
// a probe, a write failing for a missing lease) claims the end in the
// background and records a lease expiry only if the claim is its own; a
// claim that finds another Store's marker ends the session here quietly,
// taking it and its locks off this Store's gauges only, as does an
// ExpireSession settling an unknown outcome (expire.go) that finds another
// Store's marker. The recording
// Store logs and counts every lock that went with the session, read from
// etcd before its revoke (CloseSession of a session opened elsewhere,
// ExpireSession), whichever Store granted it.
//
// The marker lives at least half of the marker lease's TTL (10 s by
// default): a Store that finds the lease gone after that (a session TTL
// above it, whose keepalives are a third of the TTL apart), or that cannot
// reach etcd to claim, records the end itself, as before.

// afterCloseClaim, when set (tests only), runs in CloseSession after its
// claim of the end, before it reads the session's grants and revokes.
var afterCloseClaim func(id store.SessionID)

// claimTimeout bounds one background claim of a session found gone.
const claimTimeout = 2 * time.Second

// claimEnd claims the end of session id for this Store: true when the end
// marker is new, or this Store's own (an earlier claim whose reply was
// lost); false when another Store's marker is there.
func (s *Store) claimEnd(ctx context.Context, id store.SessionID) (bool, error) {
	key := s.endKey(id)
	for attempt := 0; ; attempt++ {
		lease, err := s.marks.lease(ctx)
		if err != nil {
			return false, classify(ctx, err)
		}
		resp, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, s.inst, clientv3.WithLease(lease))).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			if attempt == 0 && s.marks.gone(err, lease) {
				continue // the marker lease ended early: a new one
			}
			return false, classify(ctx, err)
		}
		if resp.Succeeded {
			return true, nil
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			return string(kvs[0].Value) == s.inst, nil
		}
		return false, nil // gone between the compare and the read: not ours
	}
}

// recordFoundGone records the end of session ss, whose lease this Store
// found gone (markDeadLocked), unless another Store's claim says that it
// ended the session and recorded it; held is what ss held here. It runs on
// its own goroutine, owned by s.wg.
func (s *Store) recordFoundGone(ss *session, held map[string]uint64) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.ctx, claimTimeout)
	mine, err := s.claimEnd(ctx, ss.id)
	cancel()
	if err == nil && !mine {
		s.quietEnd(ss, held)
		return
	}
	s.recordLost(ss, telemetry.LostLeaseExpired, held)
}

// quietEnd takes a session another Store ended (and recorded) off this
// Store's gauges: its held locks, and the session itself if it was opened
// here (an adopted one was never on the active gauge).
func (s *Store) quietEnd(ss *session, held map[string]uint64) {
	s.met.LocksHeld(-len(held))
	if !ss.adopted {
		s.met.SessionEnded("")
	}
}

// endQuietLocked makes a live session dead because another Store ended it
// (its claim was there first): as markDeadLocked, but recording nothing
// except this Store's gauges (s.mu held).
func (s *Store) endQuietLocked(ss *session) {
	if ss.dead {
		return
	}
	ss.dead, ss.deadAt = true, time.Now()
	close(ss.done)
	stopHoldLocked(ss, "")
	s.keep.remove(ss)
	held := ss.held
	ss.held, ss.queued = nil, nil
	s.quietEnd(ss, held)
}

// recordLost logs and counts the loss of session ss for reason (a C4 lost
// reason) with the grants it held here.
func (s *Store) recordLost(ss *session, reason string, held map[string]uint64) {
	s.log.SessionLost(ss.id, reason)
	if reason == telemetry.LostLeaseExpired {
		s.log.LeaseExpired(ss.id)
		s.met.LeaseExpired()
	}
	if ss.adopted {
		s.met.SessionLost(reason) // the active gauge counts sessions opened here
	} else {
		s.met.SessionEnded(reason)
	}
	for k, tok := range held {
		s.log.LockReleased(store.Grant{Key: k, Session: ss.id, Token: tok}, telemetry.ReleaseSessionLost)
	}
	s.met.Released(telemetry.ReleaseSessionLost, len(held))
}

// releaseGrantsLocked logs and counts grants, the session's grants as read
// from etcd before this Store ended it, as released for reason, and takes
// the grants ss held here off this Store's gauge (s.mu held; ss may be nil:
// a session this Store did not know).
func (s *Store) releaseGrantsLocked(ss *session, grants []store.Grant, reason string) {
	here := 0
	for _, g := range grants {
		s.log.LockReleased(g, reason)
		if ss != nil {
			if _, ok := ss.held[g.Key]; ok {
				here++
			}
		}
	}
	s.met.Released(reason, here) // counted, and off the gauge
	s.met.ReleasedElsewhere(reason, len(grants)-here)
	if ss != nil {
		s.met.LocksHeld(-(len(ss.held) - here)) // released through another Store meanwhile
		ss.held, ss.queued = nil, nil
	}
}

// forget drops a session from the map (after close).
func (s *Store) forget(id store.SessionID) {
	s.mu.Lock()
	delete(s.sessions, id)
	s.mu.Unlock()
}
