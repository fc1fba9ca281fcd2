package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// ExpireSession implements store.SessionRegistry (C2 #ct2-replicas, the
// etcd rule). The caller (a server whose client fell silent past every
// Remaining it granted) gives up on the session: this Store stops keeping
// its lease alive and withdraws its keeper record. The session ends (its
// lease revoked at once, as CloseSession) only if no other Store keeps it,
// decided in the transaction that deletes the session record, so a Store
// adopting it concurrently either did so first (the session is not ended)
// or finds it dead. Otherwise Expiry.Ended is false and Remaining says when
// to ask again: this Store's own proven bound, or the lease's TTL as etcd
// reports it (at least minExpireRetry); the lease then runs out by itself
// once no Store keeps it.
//
// A session this Store kept whose record is gone already (closed through
// another Store, or its lease ended) is recorded lost here (lease_expired)
// and is ErrSessionDead.
//
// When the transaction's outcome is unknown (its reply lost: it may have
// withdrawn the keeper record, or ended the session), the session is
// forgotten as if another Store kept it, and remembered as unsure: the
// caller's retry settles it. A session record gone by then was ended by the
// earlier transaction (or by the lease's expiry, which that call let happen
// by no longer keeping it), so the retry reports it Ended, revoking the
// lease if it is still there: its caller records the loss, once (returning
// ErrSessionDead instead would say that whoever ended it recorded it, and
// nobody had). Unless another Store's end marker is there: that Store ended
// the session (a close through it, or its finding the lease gone) and
// recorded it, and the retry is ErrSessionDead.
func (s *Store) ExpireSession(ctx context.Context, id store.SessionID) (_ store.Expiry, err error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Expiry{}, fmt.Errorf("etcdstore: expire session: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return store.Expiry{}, fmt.Errorf("etcdstore: expire session: %w", err)
	}
	now := time.Now()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.Expiry{}, errClosed
	}
	ss := s.sessions[id]
	if ss != nil && ss.dead {
		s.mu.Unlock()
		return store.Expiry{}, fmt.Errorf("etcdstore: expire session: %w", store.ErrSessionDead)
	}
	var (
		lease     clientv3.LeaseID
		keeperRev int64
		bound     time.Duration
		settling  bool // ss is an unsure session: an earlier call may have ended it
	)
	if ss != nil {
		// Stop keeping it first: from now on only other Stores can.
		s.keep.remove(ss)
		lease, keeperRev, bound = ss.lease, ss.keeperRev, s.keep.remaining(ss, now)
	} else if u, ok := s.unsure[id]; ok {
		// Kept by nobody here since the earlier call: no bound of ours.
		delete(s.unsure, id)
		ss, settling = u.ss, true
		lease, keeperRev = ss.lease, ss.keeperRev
	}
	s.mu.Unlock()
	if ss == nil {
		rec, _, err := s.readRecord(ctx, id)
		if err != nil {
			return store.Expiry{}, fmt.Errorf("etcdstore: expire session: %w", err)
		}
		lease = clientv3.LeaseID(rec.Lease)
	}

	ended, exists, err := s.endIfUnkept(ctx, id, keeperRev)
	if err != nil {
		if ss != nil && !errors.Is(err, store.ErrSessionDead) {
			// Nothing known of the outcome: the transaction may have
			// withdrawn this Store's keeper record, or ended the session.
			// Keeping the lease without a keeper record would let another
			// Store end the session under a client this one answers;
			// forget it instead (its client fell silent here; a later
			// call adopts it again, keeper record first), and remember
			// it until the retry settles the outcome.
			s.forgetUnsure(ss)
		} else if settling {
			s.forgetKept(ss)
		}
		return store.Expiry{}, fmt.Errorf("etcdstore: expire session: %w", err)
	}
	switch {
	case settling && !exists && s.endedElsewhere(ctx, id):
		// Another Store ended it (its close, or its finding the lease
		// gone) and recorded it: only this Store's gauges here.
		s.mu.Lock()
		s.endQuietLocked(ss)
		s.mu.Unlock()
		return store.Expiry{}, fmt.Errorf("etcdstore: expire session: %w", store.ErrSessionDead)
	case ended, settling && !exists:
		// Ended by this call or, settling, by the earlier one whose
		// reply was lost: finished here either way.
		// Its grants as etcd has them, whichever Store made them (C4
		// #ct4-replica-count: this end records every lock that goes with
		// it), read before the revoke. When the read fails (etcd
		// unreachable, or the lease gone already: a retry settling a lost
		// reply after the TTL), the grants this Store knows of are
		// recorded instead. The session is dead here before the revoke is
		// sent, so no call through this Store finds the lease gone and
		// records the end again.
		grants, err := s.locksOfDirect(ctx, &session{id: id, lease: lease})
		n := s.endLocal(ctx, ss, id, grants, err == nil)
		if !errors.Is(err, store.ErrSessionDead) {
			_, _ = s.cli.Revoke(ctx, lease)
		}
		// A failed revoke is not retried: the session record is gone (no
		// Store can adopt it) and none keeps it, so the lease runs out
		// within its TTL anyway.
		return store.Expiry{Ended: true, Released: n}, nil
	case !exists:
		if ss != nil {
			s.markDead(ss, telemetry.LostLeaseExpired)
		}
		return store.Expiry{}, fmt.Errorf("etcdstore: expire session: %w", store.ErrSessionDead)
	}
	// Another Store keeps it: forget it here (a later call adopts it
	// again) and say when to ask again.
	if ss != nil {
		s.forgetKept(ss)
	}
	if bound < minExpireRetry {
		if bound, err = s.leaseBound(ctx, lease); err != nil {
			return store.Expiry{}, fmt.Errorf("etcdstore: expire session: %w", err)
		}
	}
	return store.Expiry{Remaining: bound}, nil
}

// endedElsewhere reports whether another Store's end marker of session id
// is there: that Store ended the session and recorded the end (end.go). A
// failed read is false: this Store then records the end itself, as when
// it cannot claim.
func (s *Store) endedElsewhere(ctx context.Context, id store.SessionID) bool {
	resp, err := s.cli.Get(ctx, s.endKey(id))
	return err == nil && len(resp.Kvs) > 0 && string(resp.Kvs[0].Value) != s.inst
}

// unsureExpiry is a session ExpireSession forgot with its outcome unknown
// (Store.unsure), and since when.
type unsureExpiry struct {
	ss    *session
	since time.Time
}

// forgetUnsure forgets a session whose ExpireSession transaction has an
// unknown outcome and remembers it in Store.unsure, still counted as one of
// this Store's sessions until the outcome is settled: by a later
// ExpireSession, by an adoption (the record was still there), or by
// pruneDead after deadRetention.
func (s *Store) forgetUnsure(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.sessions[ss.id]
	if cur == ss {
		delete(s.sessions, ss.id)
	}
	if s.closed || ss.dead || cur != nil && cur != ss {
		// Nothing to settle: Close forgets everything, and a session
		// adopted again meanwhile was not ended.
		if !ss.adopted && !ss.dead {
			s.met.SessionEnded("")
		}
		return
	}
	s.unsure[ss.id] = unsureExpiry{ss: ss, since: time.Now()}
}

// dropUnsureLocked forgets the unsure session id, if any, as forgetKept
// would have (s.mu held).
func (s *Store) dropUnsureLocked(id store.SessionID) {
	u, ok := s.unsure[id]
	if !ok {
		return
	}
	delete(s.unsure, id)
	if !u.ss.adopted && !u.ss.dead {
		s.met.SessionEnded("") // no longer one of this Store's sessions
	}
}

// forgetKept drops a session this Store stopped keeping while another
// keeps it.
func (s *Store) forgetKept(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[ss.id] == ss {
		delete(s.sessions, ss.id)
	}
	if !ss.adopted && !ss.dead {
		s.met.SessionEnded("") // no longer one of this Store's sessions
	}
}

// endLocal records a session ExpireSession ended, with grants, the
// session's grants as read from etcd before the revoke (ss may be nil: a
// session this Store no longer knew), and returns how many locks it
// recorded as released. When the read failed (!read), the grants ss held
// here are recorded instead: this Store claimed the end (no other Store
// records it, C4 #ct4-replica-count), and every grant it knows of went with
// the session.
func (s *Store) endLocal(ctx context.Context, ss *session, id store.SessionID, grants []store.Grant, read bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss != nil && !ss.dead {
		if !read {
			grants = heldGrants(ss)
		}
		ss.dead, ss.deadAt = true, time.Now()
		close(ss.done)
		stopHoldLocked(ss, "")
		s.releaseGrantsLocked(ss, grants, telemetry.ReleaseSessionClosed)
		if !ss.adopted {
			s.met.SessionEnded("")
		}
	} else if ss == nil {
		s.releaseGrantsLocked(nil, grants, telemetry.ReleaseSessionClosed)
	}
	s.log.SessionClosed(ctx, id, len(grants))
	return len(grants)
}

// heldGrants lists the grants session ss holds in this Store's cache, in
// key order (s.mu held).
func heldGrants(ss *session) []store.Grant {
	grants := make([]store.Grant, 0, len(ss.held))
	for k, tok := range ss.held {
		grants = append(grants, store.Grant{Key: k, Session: ss.id, Token: tok})
	}
	slices.SortFunc(grants, func(a, b store.Grant) int { return strings.Compare(a.Key, b.Key) })
	return grants
}
