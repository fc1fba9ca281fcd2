package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// AcquireAll implements store.LockStore (C2 #ct2-acquire-all): a set of
// free keys in one Txn (GrantFree); else the keys in ascending order, each
// by this Store's own Acquire or TryInsert (one transaction per key),
// released again unless every key was granted (store.AcquireAllInOrder,
// the one algorithm of every backend).
func (s *Store) AcquireAll(ctx context.Context, id store.SessionID, keys []string, wait bool, opts ...store.AcquireOption) ([]store.Grant, bool, error) {
	gs, ok, err := store.AcquireAllInOrder(ctx, s, id, keys, wait, opts...)
	if err != nil {
		return nil, false, fmt.Errorf("etcdstore: acquire all: %w", err)
	}
	return gs, ok, nil
}

// maxSetKeys is the largest set GrantFree commits in one Txn: etcd caps
// each branch of a Txn at --max-txn-ops operations (default 128), and
// ifFree is 4 compares a key.
const maxSetKeys = 128 / 4

var _ store.SetGranter = (*Store)(nil)

// GrantFree implements store.SetGranter: ONE Txn, not through the group
// commit, whose compares are every key's ifFree and whose success branch
// puts every grant key on the session's lease. All grants share the
// commit's revision, so each key's token is its own revision as for
// TryInsert (strictly increasing per key). A set larger than maxSetKeys,
// or one etcd refuses as too many operations (a server run with a lower
// --max-txn-ops), is not granted here (granted false).
func (s *Store) GrantFree(ctx context.Context, id store.SessionID, keys []string) (gs []store.Grant, granted bool, err error) {
	if len(keys) == 0 || len(keys) > maxSetKeys {
		return nil, false, nil
	}
	start := time.Now()
	defer s.met.Observe(telemetry.OpGrantFree)(&err)
	ss, err := s.live(ctx, id)
	if err != nil {
		return nil, false, fmt.Errorf("etcdstore: grant free: %w", err)
	}
	at := time.Now()
	cmps := make([]*pb.Compare, 0, 4*len(keys))
	puts := make([]*pb.RequestOp, 0, len(keys))
	for _, k := range keys {
		kb := s.keyBytesOf(k)
		cmps = append(cmps, ifFree(kb)...)
		puts = append(puts, putGrant(ss, kb, at))
	}
	resp, err := s.kvTxn(ctx, &pb.TxnRequest{Compare: cmps, Success: puts})
	if err != nil && errors.Is(rpctypes.Error(err), rpctypes.ErrTooManyOps) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("etcdstore: grant free: %w", s.sessionErr(ctx, ss, err))
	}
	if !resp.Succeeded {
		return nil, false, nil
	}
	gs = make([]store.Grant, 0, len(keys))
	for _, k := range keys {
		g, err := s.granted(ss, k, resp.Header.Revision, at, start)
		if err != nil {
			return nil, false, fmt.Errorf("etcdstore: grant free: %w", err)
		}
		s.met.Acquire(telemetry.AcquireGranted, time.Since(start))
		gs = append(gs, g)
	}
	return gs, true, nil
}
