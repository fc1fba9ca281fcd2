package etcdstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// revokeMulti is Revoke of a semaphore or read/write key: every slot goes,
// in one transaction that deletes the key's whole slot range and its
// values and returns the slots it deleted (C2 #ct2-revoke): the slots
// current at that commit, whatever changed since the read, so nothing but
// the backend's errors fails it (before issue 21 it compared every slot it
// had read, and gave up after 10 changes with "the slots kept changing").
// A value lives only beside its slot (put compared on it, on its lease), so
// the value range holds no value of a slot the delete spares. found is
// false when the key has no slot; a read first spares a free key the write.
// The waiters, woken by the deletes, are admitted by their own attempts.
func (s *Store) revokeMulti(ctx context.Context, key string) (store.Grant, bool, error) {
	mp := s.multiPrefix(key)
	slots, values := mp+"s", mp+"v"
	resp, err := s.cli.Get(ctx, slots, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", classify(ctx, err))
	}
	if resp.Count == 0 {
		return store.Grant{}, false, nil
	}
	s.runHook(hookRevokeTry, key)
	tr, err := s.cli.Txn(ctx).Then(
		clientv3.OpDelete(slots, clientv3.WithPrefix(), clientv3.WithPrevKV()),
		clientv3.OpDelete(values, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", classify(ctx, err))
	}
	prev := tr.Responses[0].GetResponseDeleteRange().GetPrevKvs()
	if len(prev) == 0 {
		return store.Grant{}, false, nil // released meanwhile
	}
	gs := make([]store.Grant, 0, len(prev))
	for _, kv := range prev {
		g := store.Grant{Key: key, Token: s.token(kv.ModRevision)}
		if e, err := parseEntry(kv); err == nil { // a malformed one is gone all the same
			g.Session, g.AcquiredAt = e.Session, e.at
		}
		gs = append(gs, g)
	}
	slices.SortFunc(gs, func(a, b store.Grant) int { return cmp.Compare(a.Token, b.Token) })
	s.mu.Lock()
	for _, g := range gs {
		s.log.LockRevoked(ctx, key, g.Token)
		if ss := s.sessions[g.Session]; ss != nil && !ss.dead && ss.held[key] == g.Token {
			delete(ss.held, key)
			ss.heldGen++
			delete(ss.multi, key)
			s.met.Released(telemetry.ReleaseRevoked, 1)
			s.log.LockReleased(g, telemetry.ReleaseRevoked)
		}
	}
	s.mu.Unlock()
	return gs[0], true, nil
}
