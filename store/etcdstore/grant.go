package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// ifFree is the grant condition: nobody holds the key k names and nobody
// waits for it. An empty range compares as a zero key-value, so the waiter
// compare holds exactly when the key's queue is empty.
func ifFree(k keyBytes) []*pb.Compare {
	return []*pb.Compare{
		cmpCreate(k.lock, pb.Compare_EQUAL, 0),
		cmpCreateBytes(k.queue, k.queueEnd, pb.Compare_EQUAL, 0),
		ifMultiFree(k),                          // no semaphore or read/write lock either (multi.go)
		cmpCreate(k.delay, pb.Compare_EQUAL, 0), // no lock-delay running (delay.go)
	}
}

// putGrant grants the key k names to session ss at time at.
func putGrant(ss *session, k keyBytes, at time.Time) *pb.RequestOp {
	return reqPutBytes(k.lock, grantValueBytes(ss.id, at), ss.lease, false)
}

// TryInsert grants key to the session iff it is free with nobody queued.
// The grant is one transaction; its revision is the fencing token. When
// another session holds the key, that grant is returned with acquired false.
func (s *Store) TryInsert(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (g store.Grant, acquired bool, err error) {
	start := time.Now()
	defer s.met.Observe(telemetry.OpTryInsert)(&err)
	defer func() { s.met.Acquire(tryResult(ctx, acquired, err), time.Since(start)) }()
	if err := store.ValidateKey(key); err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: try insert: %w", err)
	}
	o, err := store.NewAcquireOptions(opts...)
	if err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: try insert: %w", err)
	}
	ss, err := s.live(ctx, id)
	if err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: try insert: %w", err)
	}
	if o.Multi() {
		g, acquired, err := s.acquireMulti(ctx, ss, key, o, false, start)
		if err != nil {
			return store.Grant{}, false, fmt.Errorf("etcdstore: try insert: %w", err)
		}
		return g, acquired, nil
	}
	at := time.Now()
	// An answer lost to ctx needs no cleanup: a retry finds the grant and
	// returns it (already mine). It is recorded, though, so CloseSession
	// counts it.
	k := s.keyBytesOf(key)
	resp, err := s.txn(ctx, key, ifFree(k),
		[]*pb.RequestOp{putGrant(ss, k, at)},
		[]*pb.RequestOp{reqGet(k.lock), getMultiAny(k)},
		func(resp *clientv3.TxnResponse, err error) {
			if err == nil && resp.Succeeded {
				s.recordAbandoned(ss, key, resp.Header.Revision)
			}
		})
	if err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: try insert: %w", s.sessionErr(ctx, ss, err))
	}
	if resp.Succeeded {
		g, err := s.granted(ss, key, resp.Header.Revision, at, start)
		return g, err == nil, err
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 && len(resp.Responses[1].GetResponseRange().Kvs) > 0 {
		return store.Grant{}, false, fmt.Errorf("etcdstore: try insert: %w", errMismatch(key, o))
	}
	if len(kvs) == 0 {
		return store.Grant{Key: key}, false, nil // free, but sessions are queued for it
	}
	held, err := s.grantOf(key, kvs[0])
	if err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: try insert: %w", err)
	}
	if s.owns(ss, kvs[0]) {
		return s.withRemaining(ss, held, start), true, nil
	}
	return held, false, nil
}

// tryResult is the acquire outcome label of a TryInsert that returned
// (acquired, err): unlike an Acquire, it can find the key contended (C4
// #ct4-acquire-result).
func tryResult(ctx context.Context, acquired bool, err error) string {
	if err == nil && !acquired {
		return telemetry.AcquireContended
	}
	return telemetry.AcquireResult(ctx, err)
}

// recordAbandoned records a grant written for the session by a call whose
// caller gave up while it was in flight: the grant is real (a retry returns
// it), so the Store counts it as held.
func (s *Store) recordAbandoned(ss *session, key string, rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := ss.held[key]; !ok && !ss.dead {
		ss.held[key] = s.token(rev)
		ss.heldGen++
		s.met.LocksHeld(1)
	}
}

// granted records a grant just written for the session.
func (s *Store) granted(ss *session, key string, rev int64, at, start time.Time) (store.Grant, error) {
	s.mu.Lock()
	if ss.dead {
		// Given up on while granting: nobody may trust this grant; take it
		// back (the lease's end would, too).
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		lk := s.lockKey(key)
		s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(lk), "=", rev)).Then(clientv3.OpDelete(lk)).Commit() //nolint:errcheck // best effort
		return store.Grant{}, deadErr(ss)
	}
	ss.held[key] = s.token(rev)
	ss.heldGen++
	rem := s.keep.remaining(ss, start)
	s.mu.Unlock()
	s.met.LocksHeld(1)
	g := store.Grant{Key: key, Session: ss.id, Token: s.token(rev), AcquiredAt: at, Remaining: max(rem, 0)}
	s.log.LockAcquired(g, time.Since(start))
	return g, nil
}

// withRemaining fills in the session's current bound.
func (s *Store) withRemaining(ss *session, g store.Grant, start time.Time) store.Grant {
	g.Remaining = max(s.keep.remaining(ss, start), 0)
	return g
}

// owns reports whether a grant key belongs to the session.
func (s *Store) owns(ss *session, kv *mvccpb.KeyValue) bool {
	holder, _, err := parseGrant(kv.Value)
	return err == nil && holder == ss.id && clientv3.LeaseID(kv.Lease) == ss.lease
}

// grantOf decodes a grant key.
func (s *Store) grantOf(key string, kv *mvccpb.KeyValue) (store.Grant, error) {
	holder, at, err := parseGrant(kv.Value)
	if err != nil {
		return store.Grant{}, fmt.Errorf("%w: %w", errMalformed, err)
	}
	return store.Grant{Key: key, Session: holder, Token: s.token(kv.ModRevision), AcquiredAt: at}, nil
}

// DeleteIfOwner releases key iff its current grant is (session, token).
// With nobody queued it deletes the grant in one transaction that also
// checks the queue is empty; with sessions queued that transaction instead
// reads the first of them, and a second one hands the key to it (a new
// grant, with a new token, attached to that waiter's lease), so a
// hand-over costs one commit. Either way a release marker is written in the
// committing transaction (see Watch).
//
// A transaction that could write goes through etcd's log even when its
// compares send it down a read-only branch, so the first transaction is
// skipped where the queue is likely not empty. If an Acquire call of this
// Store waits for key first in line, it is taken as the one to hand over
// to and the hand-over checks that guess (its waiter key still there, no
// older one; the waiter has seen itself first in line, so the guess is
// right unless it left meanwhile): one commit in all. Else, if the
// session waited in the queue for this grant (others likely wait too), the
// first waiter is read with a plain read: a read and a commit rather than
// two commits. A waiting Acquire of this Store that the commit handed the
// key to is told from the commit's result (C2 #ct2-release-handover).
// When the queue keeps changing under handOverTries tries, the grant goes
// by the owner compares alone and the first waiter takes the key itself.
func (s *Store) DeleteIfOwner(ctx context.Context, id store.SessionID, key string, token uint64) (err error) {
	defer s.met.Observe(telemetry.OpRelease)(&err)
	if err := store.ValidateKey(key); err != nil {
		return fmt.Errorf("etcdstore: release: %w", err)
	}
	ss, err := s.live(ctx, id)
	notOwner := notOwnerError{op: "release", key: key, token: token, id: id} // formatted only if returned (issue 24)
	rev, issued := s.revision(token)
	if errors.Is(err, store.ErrSessionDead) || (err == nil && !issued) {
		return notOwner
	}
	if err != nil {
		return fmt.Errorf("etcdstore: release: %w", err)
	}
	if s.isMulti(ss, key) {
		return s.releaseMulti(ctx, ss, key, token, notOwner) // multi.go
	}
	k := s.keyBytesOf(key)
	qp := string(k.queue)
	owner := []*pb.Compare{cmpMod(k.lock, rev), cmpLease(k.lock, pb.Compare_EQUAL, ss.lease)}
	firstWaiter := reqFirstIn(k.queue, k.queueEnd)
	// next is the waiter to hand over to, once known or guessed.
	type waiter struct {
		key   string
		rev   int64 // create revision of its waiter key
		lease clientv3.LeaseID
	}
	var next *waiter
	fromKV := func(kvs []*mvccpb.KeyValue) *waiter {
		if len(kvs) == 0 {
			return nil
		}
		return &waiter{string(kvs[0].Key), kvs[0].CreateRevision, clientv3.LeaseID(kvs[0].Lease)}
	}
	// Who is first in line: a guess from this Store's own waiters (the
	// hand-over then checks it), or, if the session waited for this grant
	// (others likely wait too), a plain read.
	if w, ok := s.waiters.first(key); ok {
		next = &waiter{s.waiterKey(key, w.ss.id), w.rev, w.ss.lease}
	} else {
		s.mu.Lock()
		lookFirst := ss.queued[key]
		s.mu.Unlock()
		if lookFirst {
			hr, err := s.cli.Get(ctx, qp, clientv3.WithPrefix(),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
			if err != nil {
				return fmt.Errorf("etcdstore: release: %w", classify(ctx, err))
			}
			next = fromKV(hr.Kvs)
		}
	}
	s.mu.Lock()
	delete(ss.queued, key)
	s.mu.Unlock()
	for range handOverTries {
		mlease, err := s.marks.lease(ctx)
		if err != nil {
			return fmt.Errorf("etcdstore: release: %w", classify(ctx, err))
		}
		marker := releaseMarkerPut(k, mlease)
		s.runHook(hookReleaseTry, key)
		var resp *clientv3.TxnResponse
		var at time.Time // the hand-over's grant time, as written
		if next == nil {
			// Release if nobody waits, else read who is first.
			resp, err = s.txn(ctx, key, owner,
				[]*pb.RequestOp{reqTxn(
					[]*pb.Compare{cmpCreateBytes(k.queue, k.queueEnd, pb.Compare_EQUAL, 0)},
					[]*pb.RequestOp{marker, reqDelete(k.lock), reqDelete(k.delay)},
					[]*pb.RequestOp{firstWaiter})},
				[]*pb.RequestOp{reqGet(k.lock)}, nil)
		} else {
			// Hand over to next if it is still queued and first in line
			// (no waiter key of key older than its own); else read again.
			to := store.SessionID(strings.TrimPrefix(next.key, qp))
			at = time.Now()
			resp, err = s.txn(ctx, key,
				append(slices.Clone(owner),
					cmpCreate(next.key, pb.Compare_EQUAL, next.rev),
					cmpCreateBytes(k.queue, k.queueEnd, pb.Compare_GREATER, next.rev-1)),
				[]*pb.RequestOp{
					marker,
					reqDelete(k.delay), // a release hands over at once (delay.go)
					reqPutBytes(k.lock, grantValueBytes(to, at), next.lease, false),
					reqDelete(next.key),
				},
				[]*pb.RequestOp{reqGet(k.lock), firstWaiter}, nil)
		}
		if s.marks.gone(err, mlease) {
			continue // the marker lease ended early: a new one
		}
		if err != nil {
			return fmt.Errorf("etcdstore: release: %w", classify(ctx, err))
		}
		if !resp.Succeeded {
			cur := resp.Responses[0].GetResponseRange().Kvs
			if len(cur) == 0 || cur[0].ModRevision != rev || clientv3.LeaseID(cur[0].Lease) != ss.lease {
				return notOwner
			}
			// Still ours: the waiter left, or the guess was not first.
			next = nil
			if len(resp.Responses) > 1 {
				next = fromKV(resp.Responses[1].GetResponseRange().Kvs)
			}
			continue
		}
		if next == nil {
			if q := resp.Responses[0].GetResponseTxn(); !q.Succeeded {
				next = fromKV(q.Responses[0].GetResponseRange().Kvs)
				continue // sessions are queued: hand over
			}
		}
		if next != nil {
			// Handed over in this commit: a waiting Acquire of this Store
			// is answered from it (C2 #ct2-release-handover).
			s.runHook(hookHandedOver, key)
			s.waiters.handOver(key, store.SessionID(strings.TrimPrefix(next.key, qp)), next.rev, handOff{rev: resp.Header.Revision, at: time.Unix(0, at.UnixNano())}) // as the watch event decodes it
		}
		s.released(ss, key, token)
		return nil
	}
	// The queue kept changing under the hand-over (waiters coming and going
	// ahead of the one each try named): the key goes by the owner compares
	// alone, which only the owner's loss fails, with the release marker and
	// the delay record's delete of every release. The first waiter, woken
	// by the delete, takes the key itself (wait.go). A release never fails
	// for contention while its caller owns the key (C2
	// #ct2-release-handover).
	for {
		mlease, err := s.marks.lease(ctx)
		if err != nil {
			return fmt.Errorf("etcdstore: release: %w", classify(ctx, err))
		}
		resp, err := s.txn(ctx, key, owner,
			[]*pb.RequestOp{releaseMarkerPut(k, mlease), reqDelete(k.lock), reqDelete(k.delay)},
			nil, nil)
		if s.marks.gone(err, mlease) {
			continue // the marker lease ended early: a new one
		}
		if err != nil {
			return fmt.Errorf("etcdstore: release: %w", classify(ctx, err))
		}
		if !resp.Succeeded {
			return notOwner
		}
		s.released(ss, key, token)
		return nil
	}
}

// released records the release of session ss's plain grant of key.
func (s *Store) released(ss *session, key string, token uint64) {
	g := store.Grant{Key: key, Session: ss.id, Token: token}
	s.mu.Lock()
	if _, ok := ss.held[key]; ok && !ss.dead {
		delete(ss.held, key)
		ss.heldGen++
		stopHoldLocked(ss, key)
		s.met.Released(telemetry.ReleaseRelease, 1)
	}
	s.mu.Unlock()
	s.log.LockReleased(g, telemetry.ReleaseRelease)
}

// Revoke deletes key's current grant whoever holds it, with a "revoked"
// marker in the same transaction (and its lock-delay started, delay.go).
func (s *Store) Revoke(ctx context.Context, key string) (g store.Grant, found bool, err error) {
	defer s.met.Observe(telemetry.OpRevoke)(&err)
	if err := store.ValidateKey(key); err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", err)
	}
	if err := s.ready(ctx); err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", err)
	}
	g, found, err = s.revokeGrant(ctx, key, 0, markRevoked) // delay.go
	if err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", err)
	}
	if !found {
		return s.revokeMulti(ctx, key) // a semaphore or read/write key, or free (multi.go)
	}
	return g, true, nil
}

// notOwnerError is the ErrNotOwner of a call naming a grant its session
// does not hold, formatted only when its message is asked for: a release
// builds it on every call and returns it on few.
type notOwnerError struct {
	op, key string
	token   uint64
	id      store.SessionID
}

func (e notOwnerError) Error() string {
	return fmt.Sprintf("%v: etcdstore: %s %q: token %d is not the current grant of session %s", store.ErrNotOwner, e.op, e.key, e.token, e.id)
}

func (e notOwnerError) Unwrap() error { return store.ErrNotOwner }
