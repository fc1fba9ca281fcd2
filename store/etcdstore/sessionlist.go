package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// listPage is how many keys one range read of the session records takes
// at most (keeper records s/<id>\x00<instance> are in the same range).
const listPage = 500

// ListSessions implements store.LockStore (C2 #ct2-list-sessions): every
// session of the prefix, whichever Store opened it, from the session
// records s/<id> (paged range reads), so every instance answers the same.
// For each listed session one lease TimeToLive with its attached keys gives
// Remaining (the lease's remaining TTL, whole seconds, counted from when the
// request was sent) and Locks (its attached grant keys); one transaction per
// 100 sessions reads their holder records. It extends nothing.
func (s *Store) ListSessions(ctx context.Context, q store.SessionQuery) (_ []store.SessionInfo, err error) {
	defer s.met.Observe(telemetry.OpListSessions)(&err)
	limit, err := store.CheckSessionQuery(q)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: list sessions: %w", err)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	base := s.prefix + spaceSession
	end := clientv3.GetPrefixRangeEnd(base)
	from := base
	if q.After != "" {
		from = s.recordKey(q.After) + "\x01" // past After's record and its keeper records
	}
	var out []store.SessionInfo
	for len(out) < limit {
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(listPage))
		if err != nil {
			return nil, fmt.Errorf("etcdstore: list sessions: %w", classify(ctx, err))
		}
		for _, kv := range resp.Kvs {
			id, ok := strings.CutPrefix(string(kv.Key), base)
			if !ok || strings.IndexByte(id, 0) >= 0 {
				continue // a keeper record
			}
			var rec sessionRecord
			if json.Unmarshal(kv.Value, &rec) != nil || rec.Lease == 0 || rec.TTLms <= 0 {
				continue // malformed: dead for every Store (readRecord)
			}
			if s.exclusive && rec.Epoch != s.shift {
				continue // of an earlier epoch: usable by no Store
			}
			if q.ByPrincipal && rec.Principal != q.Principal {
				continue
			}
			info, live, err := s.sessionInfo(ctx, store.SessionID(id), rec)
			if err != nil {
				return nil, err
			}
			if !live {
				continue
			}
			out = append(out, info)
			if len(out) == limit {
				break
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	if err := s.readHolders(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

// sessionInfo asks etcd for the lease of session id: live is false when
// the lease is gone or less than a second from its end.
func (s *Store) sessionInfo(ctx context.Context, id store.SessionID, rec sessionRecord) (store.SessionInfo, bool, error) {
	sent := time.Now()
	ttl, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(rec.Lease), clientv3.WithAttachedKeys())
	if err != nil {
		if err = classify(ctx, err); !errors.Is(err, store.ErrSessionDead) {
			return store.SessionInfo{}, false, fmt.Errorf("etcdstore: list sessions: %w", err)
		}
		return store.SessionInfo{}, false, nil
	}
	if ttl.TTL <= 0 {
		return store.SessionInfo{}, false, nil
	}
	full := time.Duration(rec.TTLms) * time.Millisecond
	rem := min(time.Until(sent.Add(time.Duration(ttl.TTL)*time.Second)), full)
	if rem <= 0 {
		return store.SessionInfo{}, false, nil
	}
	locks := 0
	for _, k := range ttl.Keys {
		if _, ok := s.userKey(k); ok || s.isSlotKey(k) {
			locks++
		}
	}
	return store.SessionInfo{ID: id, Principal: rec.Principal, TTL: full, Remaining: rem, Locks: locks}, true, nil
}

// readHolders fills in the owner and labels of infos from their holder
// records.
func (s *Store) readHolders(ctx context.Context, infos []store.SessionInfo) error {
	for chunk := range slices.Chunk(infos, 100) {
		ops := make([]clientv3.Op, len(chunk))
		for i, in := range chunk {
			ops[i] = clientv3.OpGet(s.holderKey(in.ID))
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("etcdstore: list sessions: %w", classify(ctx, err))
		}
		for i, r := range resp.Responses {
			if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
				chunk[i].Owner, chunk[i].Labels = parseHolderRecord(kvs[0].Value)
			}
		}
	}
	return nil
}
