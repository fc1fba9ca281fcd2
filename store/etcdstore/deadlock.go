package etcdstore

import (
	"context"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/store"
)

// noCheckMark follows the session id in the value of a waiter key queued
// with store.NoDeadlockCheck (C2 #ct2-deadlock); a checking waiter's value
// is the session id alone.
const noCheckMark = " no-deadlock-check"

// waiterValue is the value of a plain waiter key.
func waiterValue(id store.SessionID, noCheck bool) string {
	if noCheck {
		return string(id) + noCheckMark
	}
	return string(id)
}

// multiNoCheck is the fourth field of a semaphore or read/write waiter's
// value ("<mode> <limit> <session> 1", multi.go) queued with
// store.NoDeadlockCheck (C2 #ct2-deadlock); a checking waiter has three.
// parseEntry reads a fourth field as a time, which a waiter never uses, so
// servers from before it read such a waiter unchanged.
const multiNoCheck = "1"

// mwaiterValue is the value of a semaphore or read/write waiter key.
func mwaiterValue(id store.SessionID, o store.AcquireOptions) string {
	if o.NoDeadlockCheck {
		return entryValue(id, o) + " " + multiNoCheck
	}
	return entryValue(id, o)
}

var _ store.DeadlockScanGater = (*Store)(nil)

// SetDeadlockScanGate is store.DeadlockScanGater (tests, C2
// #ct2-deadlock "Test hook").
func (s *Store) SetDeadlockScanGate(gate func(ctx context.Context)) { s.deadlocks.SetGate(gate) }

// waitGraph reads the wait-for graph (C2 #ct2-deadlock) for the deadlock
// detector: the plain grants (l/) and waiters (q/) and the semaphore and
// read/write slots and waiters (m/) in one read-only Txn, at one revision.
// A waiter's Seq is its waiter key's create revision, its place in FIFO
// order over every kind.
func (s *Store) waitGraph(ctx context.Context) (store.WaitGraph, error) {
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(s.grantSpace(), clientv3.WithPrefix()),
		clientv3.OpGet(s.queueSpace(), clientv3.WithPrefix()),
		clientv3.OpGet(s.multiSpace(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return store.WaitGraph{}, classify(ctx, err)
	}
	var g store.WaitGraph
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		key, ok := s.userKey(kv.Key)
		if !ok {
			continue // a marker
		}
		holder, _, err := parseGrant(kv.Value)
		if err != nil {
			continue // not a grant this Store can read: not an edge
		}
		g.Holds = append(g.Holds, store.Hold{Session: holder, Key: key})
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		key, id, ok := s.parseWaiterKey(kv.Key)
		if !ok {
			continue
		}
		g.Waits = append(g.Waits, store.Wait{
			Session: id,
			Key:     key,
			Seq:     kv.CreateRevision,
			NoCheck: strings.HasSuffix(string(kv.Value), noCheckMark),
		})
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		key, kind, ok := s.parseMultiKey(kv.Key)
		if !ok || (kind != 's' && kind != 'w') {
			continue // a slot's value
		}
		e, err := parseEntry(kv)
		if err != nil {
			continue // not an entry this Store can read: not an edge
		}
		if kind == 's' {
			g.Holds = append(g.Holds, store.Hold{Session: e.Session, Key: key, Mode: e.Mode})
			continue
		}
		f := strings.Fields(string(kv.Value))
		g.Waits = append(g.Waits, store.Wait{
			Session: e.Session,
			Key:     key,
			Seq:     kv.CreateRevision,
			NoCheck: len(f) == 4 && f[3] == multiNoCheck,
			Limit:   e.Limit,
			Mode:    e.Mode,
		})
	}
	return g, nil
}

// checkedWait is wait (wait.go) under the deadlock detector, unless
// noCheck: the detector ends the wait by cancelling its context, and a
// grant the wait got first wins. A refused wait leaves its place, also a
// kept one, with a grant a cut step took (leave), and returns the
// *store.DeadlockError (C2 #ct2-deadlock).
func (s *Store) checkedWait(ctx context.Context, ss *session, key string, myRev int64, start time.Time, noCheck bool) (store.Grant, error) {
	if noCheck {
		return s.wait(ctx, ss, key, myRev, start)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dw := s.deadlocks.Register(ss.id, key, cancel)
	defer dw.Done()
	g, err := s.wait(wctx, ss, key, myRev, start)
	if err != nil && ctx.Err() == nil {
		if de := dw.Err(); de != nil {
			s.leave(ss, key, myRev)
			return store.Grant{}, de
		}
	}
	return g, err
}
