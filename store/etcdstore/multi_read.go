package etcdstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"lock.dev/lockd/store"
)

// multiInfo builds the LockInfo of a semaphore or read/write key from its
// decoded range; found is false without slots.
func (s *Store) multiInfo(ctx context.Context, key string, rev int64, st multiState) (store.LockInfo, bool, error) {
	info := store.LockInfo{Key: key}
	for _, w := range st.waiters {
		info.Waiters = append(info.Waiters, w.Session)
	}
	if len(st.slots) == 0 {
		return info, false, nil
	}
	info.Limit, info.RW = st.slots[0].Limit, st.slots[0].Mode != store.ModeUnset
	// Owners and labels: the sessions' holder records, read like a plain
	// key's (fillHolders), one LockInfo per slot.
	per := make([]store.LockInfo, len(st.slots))
	for i, e := range st.slots {
		per[i] = store.LockInfo{Key: key, Session: e.Session, Token: s.token(e.kv.ModRevision)}
	}
	if err := s.fillOwners(ctx, rev, per); err != nil {
		return store.LockInfo{}, false, err
	}
	for i, e := range st.slots {
		h := store.HolderInfo{Session: e.Session, Token: per[i].Token, Mode: e.Mode, AcquiredAt: e.at, Owner: per[i].Owner, Labels: per[i].Labels}
		if tok, v, ok := strings.Cut(string(st.values[e.Session]), " "); ok && v != "" && tok == strconv.FormatUint(h.Token, 10) {
			h.Value = []byte(v)
		}
		info.Holders = append(info.Holders, h)
	}
	h := info.Holders[0]
	info.Session, info.Token, info.AcquiredAt, info.Owner, info.Labels, info.Value = h.Session, h.Token, h.AcquiredAt, h.Owner, h.Labels, h.Value
	return info, true, nil
}

// fillOwners fills in the owner and labels of infos from the sessions'
// holder records at revision rev.
func (s *Store) fillOwners(ctx context.Context, rev int64, infos []store.LockInfo) error {
	ops := make([]clientv3.Op, 0, len(infos))
	for _, in := range infos {
		ops = append(ops, clientv3.OpGet(s.holderKey(in.Session), clientv3.WithRev(rev)))
	}
	for i := 0; i < len(ops); i += 128 { // etcd's bound on operations per transaction
		resp, err := s.cli.Txn(ctx).Then(ops[i:min(i+128, len(ops))]...).Commit()
		if err != nil {
			return classify(ctx, err)
		}
		for j, r := range resp.Responses {
			if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
				in := &infos[i+j]
				in.Owner, in.Labels = parseHolderRecord(kvs[0].Value)
			}
		}
	}
	return nil
}

// inspectMulti is Inspect of a key that has no plain grant.
func (s *Store) inspectMulti(ctx context.Context, key string, rev int64) (store.LockInfo, bool, error) {
	resp, err := s.cli.Get(ctx, s.multiPrefix(key), clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return store.LockInfo{}, false, classify(ctx, err)
	}
	st, err := s.decodeMulti(key, resp.Kvs)
	if err != nil {
		return store.LockInfo{}, false, err
	}
	return s.multiInfo(ctx, key, rev, st)
}

// listMulti is List's page of semaphore and read/write keys: up to limit
// keys with slots, with prefix, after `after`, at revision rev (0: now).
func (s *Store) listMulti(ctx context.Context, prefix, after string, limit int, rev int64) ([]store.LockInfo, error) {
	from := s.prefix + spaceMulti + prefix
	end := clientv3.GetPrefixRangeEnd(from)
	if after != "" {
		if a := s.multiPrefix(after) + "\xff"; a > from {
			from = a // past every entry of after
		}
	}
	var infos []store.LockInfo
	for len(infos) < limit && from < end {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(maxListPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, from, opts...)
		if err != nil {
			return nil, classify(ctx, err)
		}
		rev = resp.Header.Revision
		// Group by key; the last key of a full page may be cut: read it
		// whole with the next page.
		kvs := resp.Kvs
		byKey := map[string][]*mvccpb.KeyValue{}
		var order []string
		for _, kv := range kvs {
			k, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), s.prefix+spaceMulti), "\x00")
			if !ok {
				continue
			}
			if _, seen := byKey[k]; !seen {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], kv)
		}
		if resp.More && len(order) > 1 {
			order = order[:len(order)-1]
		}
		for _, k := range order {
			from = s.multiPrefix(k) + "\xff"
			st, err := s.decodeMulti(k, byKey[k])
			if err != nil {
				return nil, err
			}
			info, found, err := s.multiInfo(ctx, k, rev, st)
			if err != nil {
				return nil, err
			}
			if found {
				infos = append(infos, info)
				if len(infos) == limit {
					break
				}
			}
		}
		if !resp.More {
			break
		}
	}
	return infos, nil
}

// multiGrantOf decodes a slot key of the session attached to its lease
// (LocksOf); ok is false for any other key.
func (s *Store) multiGrantOf(kv *mvccpb.KeyValue, id store.SessionID, lease clientv3.LeaseID) (store.Grant, bool) {
	rest, ok := strings.CutPrefix(string(kv.Key), s.prefix+spaceMulti)
	if !ok {
		return store.Grant{}, false
	}
	key, tail, ok := strings.Cut(rest, "\x00")
	if !ok || tail != "s"+string(id) || clientv3.LeaseID(kv.Lease) != lease {
		return store.Grant{}, false
	}
	e, err := parseEntry(kv)
	if err != nil || e.Session != id {
		return store.Grant{}, false
	}
	return store.Grant{Key: key, Session: id, Token: s.token(kv.ModRevision), AcquiredAt: e.at}, true
}

// parseHolderRecord decodes a session's holder record (holder.go).
func parseHolderRecord(v []byte) (string, map[string]string) {
	var h holderRecord
	if json.Unmarshal(v, &h) != nil {
		return "", nil
	}
	return h.Owner, h.Labels
}

// List pages through held keys under prefix: plain keys (listPlain) and
// semaphore and read/write keys (listMulti), merged in key order. The two
// kinds are read in two snapshots; a key never has both at once.
func (s *Store) List(ctx context.Context, prefix, after string, limit int) ([]store.LockInfo, error) {
	plain, err := s.listPlain(ctx, prefix, after, limit)
	if err != nil {
		return nil, err
	}
	limit, _ = store.ListLimit(limit) // checked by listPlain
	multi, err := s.listMulti(ctx, prefix, after, limit, 0)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: list: %w", err)
	}
	if len(multi) == 0 {
		return plain, nil
	}
	out := append(plain, multi...)
	slices.SortFunc(out, func(a, b store.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	out = slices.CompactFunc(out, func(a, b store.LockInfo) bool { return a.Key == b.Key })
	return out[:min(len(out), limit)], nil
}
