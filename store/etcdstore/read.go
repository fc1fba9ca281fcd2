package etcdstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Inspect reads key's grant and queue in one snapshot.
func (s *Store) Inspect(ctx context.Context, key string) (info store.LockInfo, found bool, err error) {
	defer s.met.Observe(telemetry.OpInspect)(&err)
	if err := store.ValidateKey(key); err != nil {
		return store.LockInfo{}, false, fmt.Errorf("etcdstore: inspect: %w", err)
	}
	if err := s.ready(ctx); err != nil {
		return store.LockInfo{}, false, fmt.Errorf("etcdstore: inspect: %w", err)
	}
	qp := s.queuePrefix(key)
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(s.lockKey(key)),
		clientv3.OpGet(qp, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
		clientv3.OpGet(s.delayKey(key)),
	).Commit()
	if err != nil {
		return store.LockInfo{}, false, fmt.Errorf("etcdstore: inspect: %w", classify(ctx, err))
	}
	info = store.LockInfo{Key: key}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		info.Waiters = append(info.Waiters, store.SessionID(strings.TrimPrefix(string(kv.Key), qp)))
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	dkv := resp.Responses[2].GetResponseRange().Kvs
	if len(kvs) == 0 {
		// A semaphore or read/write key (multi.go), or free, perhaps
		// with a lock-delay running (delay.go).
		minfo, found, err := s.inspectMulti(ctx, key, resp.Header.Revision)
		if err != nil {
			return store.LockInfo{}, false, fmt.Errorf("etcdstore: inspect: %w", err)
		}
		if found || len(dkv) == 0 {
			return minfo, found, nil
		}
		if info.DelayRemaining, err = s.delayLeft(ctx, dkv[0]); err != nil {
			return store.LockInfo{}, false, fmt.Errorf("etcdstore: inspect: %w", err)
		}
		return info, false, nil
	}
	g, err := s.grantOf(key, kvs[0])
	if err != nil {
		return store.LockInfo{}, false, fmt.Errorf("etcdstore: inspect: %w", err)
	}
	info.Session, info.Token, info.AcquiredAt = g.Session, g.Token, g.AcquiredAt
	one := []store.LockInfo{info}
	if err := s.fillHolders(ctx, resp.Header.Revision, one); err != nil {
		return store.LockInfo{}, false, fmt.Errorf("etcdstore: inspect: %w", err)
	}
	return one[0], true, nil
}

// maxListPage caps one range read of List.
const maxListPage = 4096

// listPlain pages through held plain keys under prefix, with their queues,
// from one snapshot (List, multi.go, adds the semaphore and read/write
// keys).
func (s *Store) listPlain(ctx context.Context, prefix, after string, limit int) (_ []store.LockInfo, err error) {
	defer s.met.Observe(telemetry.OpList)(&err)
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("etcdstore: list: %w", err)
	}
	limit, err = store.ListLimit(limit)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: list: %w", err)
	}
	if err := s.ready(ctx); err != nil {
		return nil, fmt.Errorf("etcdstore: list: %w", err)
	}
	from := s.lockKey(prefix)
	end := clientv3.GetPrefixRangeEnd(from)
	if after != "" {
		if a := s.lockKey(after) + "\x00"; a > from {
			from = a // the smallest etcd key past after's grant
		}
	}
	var (
		infos []store.LockInfo
		rev   int64
		page  int
	)
	// Markers sit between grant keys; page until limit grants are found.
	// Markers live for a bounded time (package doc), so a call reads at
	// most limit grants plus the markers alive in the range; the page
	// doubles while it finds markers, so that takes O(log) round trips.
	for len(infos) < limit && from < end {
		page = min(max(2*(limit-len(infos))+1, 2*page), maxListPage)
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(page))}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, from, opts...)
		if err != nil {
			return nil, fmt.Errorf("etcdstore: list: %w", classify(ctx, err))
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			from = string(kv.Key) + "\x00"
			key, ok := s.userKey(kv.Key)
			if !ok {
				continue
			}
			g, err := s.grantOf(key, kv)
			if err != nil {
				return nil, fmt.Errorf("etcdstore: list: %w", err)
			}
			infos = append(infos, store.LockInfo{Key: key, Session: g.Session, Token: g.Token, AcquiredAt: g.AcquiredAt})
			if len(infos) == limit {
				break
			}
		}
		if !resp.More {
			break
		}
	}
	if len(infos) == 0 {
		return nil, nil
	}
	// Queues of the listed keys, from the same snapshot: one range from the
	// first key's queue to the end of the last one's.
	qfrom := s.queuePrefix(infos[0].Key)
	qend := clientv3.GetPrefixRangeEnd(s.queuePrefix(infos[len(infos)-1].Key))
	resp, err := s.cli.Get(ctx, qfrom, clientv3.WithRange(qend), clientv3.WithRev(rev))
	if err != nil {
		return nil, fmt.Errorf("etcdstore: list: %w", classify(ctx, err))
	}
	if err := s.fillHolders(ctx, rev, infos); err != nil {
		return nil, fmt.Errorf("etcdstore: list: %w", err)
	}
	queues := make(map[string][]*mvccpb.KeyValue)
	for _, kv := range resp.Kvs {
		k, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), s.prefix+spaceQueue), "\x00")
		if ok {
			queues[k] = append(queues[k], kv)
		}
	}
	for i := range infos {
		q := queues[infos[i].Key]
		slices.SortFunc(q, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
		for _, kv := range q {
			infos[i].Waiters = append(infos[i].Waiters, store.SessionID(strings.TrimPrefix(string(kv.Key), s.queuePrefix(infos[i].Key))))
		}
	}
	return infos, nil
}
