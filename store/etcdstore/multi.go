package etcdstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Semaphores and read/write locks (C2 #ct2-multi). A key of either kind
// lives under m/<key>\x00, apart from the plain grant and queue keys:
//
//	m/<key>\x00s<session>  a slot: "<mode> <limit> <session> <unix ns>" on the
//	                       holder's lease; its mod revision is the token
//	m/<key>\x00w<session>  a waiter: "<mode> <limit> <session>" on the
//	                       waiter's lease; create revision orders the queue
//	m/<key>\x00v<session>  a slot's value: "<token> <value>" on the lease
//
// Every write is one transaction that compares the whole m/<key>\x00 range
// against the snapshot it decided on (no key in it newer than that
// revision) and that the key's plain grant and plain queue are empty; the
// plain grant paths in turn require the m/ range to be empty (ifFree, and
// Acquire's queueing). So the two kinds never hold one key at once, and a
// request of the other kind sees the first and fails with
// store.ErrLimitMismatch. Deleted entries only make a decision more
// permissive, so a snapshot whose range has no newer key is still a sound
// basis for a grant. A waiter watches the range and keeps it up to date
// from the events, so only a waiter the events make grantable writes (see
// acquireMulti); it reads the range again only when a write's compare
// fails or its watch breaks.

func (s *Store) slotValueKey(key string, id store.SessionID) string {
	return s.multiPrefix(key) + "v" + string(id)
}

// ifMultiFree is the plain grant's extra condition: nobody holds or waits
// for key as a semaphore or read/write lock.
func (s *Store) ifMultiFree(key string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(s.multiPrefix(key)), "=", 0).WithPrefix()
}

// multiActive reads whether key has semaphore or read/write entries (the
// response of an OpGet built by getMultiAny).
func (s *Store) getMultiAny(key string) clientv3.Op {
	return clientv3.OpGet(s.multiPrefix(key), clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
}

func errMismatch(key string, o store.AcquireOptions) error {
	return fmt.Errorf("%w: key %q is held or awaited as another kind of lock than %s", store.ErrLimitMismatch, key, describe(o))
}

// describe names a request's kind for errors.
func describe(o store.AcquireOptions) string {
	switch {
	case o.RW():
		return "a read/write lock (" + o.Mode.String() + ")"
	case o.Limit > 1:
		return "a semaphore of " + strconv.FormatUint(uint64(o.Limit), 10)
	}
	return "a plain lock"
}

// slotEntry is a decoded slot or waiter.
type slotEntry struct {
	store.MultiEntry
	at time.Time
	kv *mvccpb.KeyValue
}

func entryValue(id store.SessionID, o store.AcquireOptions) string {
	return strconv.Itoa(int(o.Mode)) + " " + strconv.FormatUint(uint64(o.Limit), 10) + " " + string(id)
}

func parseEntry(kv *mvccpb.KeyValue) (slotEntry, error) {
	f := strings.Split(string(kv.Value), " ")
	if len(f) < 3 || len(f) > 4 || f[2] == "" {
		return slotEntry{}, fmt.Errorf("%w: entry %q", errMalformed, kv.Value)
	}
	m, err1 := strconv.ParseUint(f[0], 10, 8)
	l, err2 := strconv.ParseUint(f[1], 10, 32)
	e := slotEntry{MultiEntry: store.MultiEntry{Session: store.SessionID(f[2]), Limit: uint32(l), Mode: store.Mode(m)}, kv: kv}
	if len(f) == 4 {
		ns, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			return slotEntry{}, fmt.Errorf("%w: entry %q", errMalformed, kv.Value)
		}
		e.at = time.Unix(0, ns)
	}
	if err := errors.Join(err1, err2); err != nil {
		return slotEntry{}, fmt.Errorf("%w: entry %q", errMalformed, kv.Value)
	}
	return e, nil
}

// multiState is the m/<key> range decoded: slots in token order, waiters in
// queue order, values by session.
type multiState struct {
	slots, waiters []slotEntry
	values         map[store.SessionID][]byte
}

func (s *Store) decodeMulti(key string, kvs []*mvccpb.KeyValue) (multiState, error) {
	r := s.newRange(key)
	for _, kv := range kvs {
		if err := r.put(kv); err != nil {
			return multiState{}, err
		}
	}
	return r.state(), nil
}

// multiRange is the m/<key> range decoded entry by entry, so that a waiter
// following it from watch events parses each entry once.
type multiRange struct {
	mp             string
	slots, waiters map[string]slotEntry
	values         map[store.SessionID][]byte
}

func (s *Store) newRange(key string) *multiRange {
	return &multiRange{mp: s.multiPrefix(key), slots: map[string]slotEntry{}, waiters: map[string]slotEntry{},
		values: map[store.SessionID][]byte{}}
}

// put records kv, an entry of the range as read or put.
func (r *multiRange) put(kv *mvccpb.KeyValue) error {
	rest := strings.TrimPrefix(string(kv.Key), r.mp)
	if rest == "" || rest == string(kv.Key) {
		return nil
	}
	switch rest[0] {
	case 's', 'w':
		e, err := parseEntry(kv)
		if err != nil {
			return err
		}
		if rest[0] == 's' {
			r.slots[rest] = e
		} else {
			r.waiters[rest] = e
		}
	case 'v':
		r.values[store.SessionID(rest[1:])] = kv.Value
	}
	return nil
}

// del forgets the entry at key (deleted).
func (r *multiRange) del(key []byte) {
	rest := strings.TrimPrefix(string(key), r.mp)
	delete(r.slots, rest)
	delete(r.waiters, rest)
	if strings.HasPrefix(rest, "v") {
		delete(r.values, store.SessionID(rest[1:]))
	}
}

// state is the range as a multiState: slots in token order, waiters in
// queue order.
func (r *multiRange) state() multiState {
	st := multiState{slots: slices.Collect(maps.Values(r.slots)), waiters: slices.Collect(maps.Values(r.waiters)), values: r.values}
	slices.SortFunc(st.slots, func(a, b slotEntry) int { return cmp.Compare(a.kv.ModRevision, b.kv.ModRevision) })
	slices.SortFunc(st.waiters, func(a, b slotEntry) int { return cmp.Compare(a.kv.CreateRevision, b.kv.CreateRevision) })
	return st
}

func entries(es []slotEntry) []store.MultiEntry {
	out := make([]store.MultiEntry, len(es))
	for i, e := range es {
		out[i] = e.MultiEntry
	}
	return out
}

// acquireMulti is Acquire (wait) and TryInsert (!wait) of a semaphore slot
// or a side of a read/write lock.
//
// A queued waiter keeps the m/<key> range it decided on and follows it
// from its watch's events instead of reading it again on every change:
// only a waiter that the events make grantable (the queue's head, with a
// slot free) writes, so a release costs one transaction, not one read per
// waiter. The watch is armed from the current revision (served at once,
// armWatch) and the range read after it, so nothing falls between the two;
// events at or below the read's revision are already in it. A grant whose
// compare fails (the range changed after what the waiter has seen) or a
// broken watch reads the range again.
func (s *Store) acquireMulti(ctx context.Context, ss *session, key string, o store.AcquireOptions, wait bool, start time.Time) (_ store.Grant, acquired bool, err error) {
	mp, sk, wk := s.multiPrefix(key), s.slotKey(key, ss.id), s.mwaiterKey(key, ss.id)
	var (
		queued bool
		w      *keyWatch
		rev    int64       // the revision the range below is as of
		seen   int64       // the revision of the last read
		rng    *multiRange // the m/<key> range
		read   = true      // read the range (and the plain keys) again
	)
	defer func() {
		w.close()
		if queued && err != nil {
			s.leaveMulti(ss, key)
		}
	}()
	for {
		if read {
			resp, err := s.cli.Txn(ctx).Then(
				clientv3.OpGet(s.lockKey(key), clientv3.WithKeysOnly()),
				clientv3.OpGet(s.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly()),
				clientv3.OpGet(mp, clientv3.WithPrefix()),
			).Commit()
			if err != nil {
				return store.Grant{}, false, s.sessionErr(ctx, ss, err)
			}
			if len(resp.Responses[0].GetResponseRange().Kvs) > 0 || len(resp.Responses[1].GetResponseRange().Kvs) > 0 {
				return store.Grant{}, false, errMismatch(key, o) // a plain lock
			}
			rev, seen, read = resp.Header.Revision, resp.Header.Revision, false
			rng = s.newRange(key)
			for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
				if err := rng.put(kv); err != nil {
					return store.Grant{}, false, err
				}
			}
		}
		st := rng.state()
		for _, e := range st.slots {
			if e.Session == ss.id && clientv3.LeaseID(e.kv.Lease) == ss.lease {
				// Held already: that grant, at once.
				return s.withRemaining(ss, store.Grant{Key: key, Session: ss.id, Token: s.token(e.kv.ModRevision), AcquiredAt: e.at}, start), true, nil
			}
		}
		mine := slices.IndexFunc(st.waiters, func(e slotEntry) bool { return e.Session == ss.id })
		if queued && mine < 0 {
			return store.Grant{}, false, s.waiterGone(ctx, ss)
		}
		unchanged := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(s.lockKey(key)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.queuePrefix(key)), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.ModRevision(mp), "<", rev+1).WithPrefix(),
		}
		switch store.Admit(ss.id, o, entries(st.slots), entries(st.waiters)) {
		case store.AdmitMismatch:
			return store.Grant{}, false, errMismatch(key, o)
		case store.AdmitGrant:
			at := time.Now()
			tr, err := s.cli.Txn(ctx).If(unchanged...).Then(
				clientv3.OpPut(sk, entryValue(ss.id, o)+" "+strconv.FormatInt(at.UnixNano(), 10), clientv3.WithLease(ss.lease)),
				clientv3.OpDelete(wk),
			).Commit()
			if err != nil {
				return store.Grant{}, false, s.sessionErr(ctx, ss, err)
			}
			if tr.Succeeded {
				g, err := s.slotGranted(ss, key, tr.Header.Revision, at, start)
				return g, err == nil, err
			}
			read = true // changed meanwhile: decide again
			continue
		}
		if !wait {
			return store.Grant{Key: key}, false, nil
		}
		if mine < 0 {
			tr, err := s.cli.Txn(ctx).If(unchanged...).Then(
				clientv3.OpPut(wk, entryValue(ss.id, o), clientv3.WithLease(ss.lease)),
			).Commit()
			if err != nil {
				return store.Grant{}, false, s.sessionErr(ctx, ss, err)
			}
			queued = queued || tr.Succeeded
			read = true // decide again with our place in the queue
			continue
		}
		queued = true
		if w == nil {
			// Every change of the range after the watch is armed reaches
			// it; the read after it sees everything earlier.
			if w, err = s.armWatch(ctx, ss, mp, clientv3.WithPrefix()); err != nil {
				return store.Grant{}, false, err
			}
			read = true
			continue
		}
		// Wait for a change that can make this waiter grantable: a delete
		// (a slot freed, a waiter ahead gone, or this waiter's own entry).
		// Puts alone only add holders or later waiters.
		for freed := false; !freed && !read; {
			select {
			case wr, ok := <-w.ch:
				if !ok || wr.Canceled || wr.Err() != nil {
					w.close()
					w, read = nil, true
					if err := ctx.Err(); err != nil {
						return store.Grant{}, false, err
					}
					continue
				}
				for _, ev := range wr.Events {
					if ev.Kv.ModRevision <= seen {
						continue // in the read already (the events of one transaction share a revision)
					}
					if ev.Type == clientv3.EventTypeDelete {
						rng.del(ev.Kv.Key)
						freed = true
					} else if err := rng.put(ev.Kv); err != nil {
						return store.Grant{}, false, err
					}
					rev = ev.Kv.ModRevision
				}
			case <-ctx.Done():
				return store.Grant{}, false, ctx.Err()
			case <-ss.done:
				return store.Grant{}, false, deadErr(ss)
			case <-s.ctx.Done():
				return store.Grant{}, false, errClosed
			}
		}
	}
}

// slotGranted records a slot just written for the session.
func (s *Store) slotGranted(ss *session, key string, rev int64, at, start time.Time) (store.Grant, error) {
	s.mu.Lock()
	if ss.dead {
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		sk := s.slotKey(key, ss.id)
		s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(sk), "=", rev)).Then(clientv3.OpDelete(sk)).Commit() //nolint:errcheck // best effort; the lease's end removes it too
		return store.Grant{}, deadErr(ss)
	}
	ss.held[key] = s.token(rev)
	ss.heldGen++
	if ss.multi == nil {
		ss.multi = map[string]bool{}
	}
	ss.multi[key] = true
	rem := s.keep.remaining(ss, start)
	s.mu.Unlock()
	s.met.LocksHeld(1)
	g := store.Grant{Key: key, Session: ss.id, Token: s.token(rev), AcquiredAt: at, Remaining: max(rem, 0)}
	s.log.LockAcquired(g, time.Since(start))
	return g, nil
}

// leaveMulti removes the session's waiter entry of key, best effort, on a
// context of its own (the caller's may be done); the lease's end removes it
// otherwise.
func (s *Store) leaveMulti(ss *session, key string) {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	s.cli.Delete(ctx, s.mwaiterKey(key, ss.id)) //nolint:errcheck // best effort
}

// isMulti reports whether the session's grant of key is a slot.
func (s *Store) isMulti(ss *session, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ss.multi[key]
}

// releaseMulti is DeleteIfOwner of a slot.
func (s *Store) releaseMulti(ctx context.Context, ss *session, key string, token uint64, notOwner error) error {
	rev, issued := s.revision(token)
	if !issued {
		return notOwner
	}
	sk := s.slotKey(key, ss.id)
	resp, err := s.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(sk), "=", rev),
		clientv3.Compare(clientv3.LeaseValue(sk), "=", ss.lease),
	).Then(clientv3.OpDelete(sk), clientv3.OpDelete(s.slotValueKey(key, ss.id))).Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: release: %w", classify(ctx, err))
	}
	if !resp.Succeeded {
		return notOwner
	}
	g := store.Grant{Key: key, Session: ss.id, Token: token}
	s.mu.Lock()
	if ss.held[key] == token && !ss.dead {
		delete(ss.held, key)
		ss.heldGen++
		delete(ss.multi, key)
		s.met.Released(telemetry.ReleaseRelease, 1)
	}
	s.mu.Unlock()
	s.log.LockReleased(g, telemetry.ReleaseRelease)
	return nil
}

// setValueMulti is SetValue of a slot.
func (s *Store) setValueMulti(ctx context.Context, ss *session, key string, token uint64, value []byte, notOwner error) error {
	rev, issued := s.revision(token)
	if !issued {
		return notOwner
	}
	sk := s.slotKey(key, ss.id)
	resp, err := s.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(sk), "=", rev),
		clientv3.Compare(clientv3.LeaseValue(sk), "=", ss.lease),
	).Then(clientv3.OpPut(s.slotValueKey(key, ss.id), strconv.FormatUint(token, 10)+" "+string(value), clientv3.WithLease(ss.lease))).Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: set value: %w", classify(ctx, err))
	}
	if !resp.Succeeded {
		return notOwner
	}
	return nil
}

// revokeMulti is Revoke of a semaphore or read/write key: every slot goes,
// in one transaction; found is false when it has none.
func (s *Store) revokeMulti(ctx context.Context, key string) (store.Grant, bool, error) {
	mp := s.multiPrefix(key)
	for range 10 {
		resp, err := s.cli.Get(ctx, mp, clientv3.WithPrefix())
		if err != nil {
			return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", classify(ctx, err))
		}
		st, err := s.decodeMulti(key, resp.Kvs)
		if err != nil {
			return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", err)
		}
		if len(st.slots) == 0 {
			return store.Grant{}, false, nil
		}
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, e := range st.slots {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(e.kv.Key)), "=", e.kv.ModRevision))
			ops = append(ops, clientv3.OpDelete(string(e.kv.Key)), clientv3.OpDelete(s.slotValueKey(key, e.Session)))
		}
		tr, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", classify(ctx, err))
		}
		if !tr.Succeeded {
			continue
		}
		s.mu.Lock()
		for _, e := range st.slots {
			tok := s.token(e.kv.ModRevision)
			s.log.LockRevoked(ctx, key, tok)
			if ss := s.sessions[e.Session]; ss != nil && !ss.dead && ss.held[key] == tok {
				delete(ss.held, key)
				ss.heldGen++
				delete(ss.multi, key)
				s.met.Released(telemetry.ReleaseRevoked, 1)
				s.log.LockReleased(store.Grant{Key: key, Session: e.Session, Token: tok, AcquiredAt: e.at}, telemetry.ReleaseRevoked)
			}
		}
		s.mu.Unlock()
		first := st.slots[0]
		return store.Grant{Key: key, Session: first.Session, Token: s.token(first.kv.ModRevision), AcquiredAt: first.at}, true, nil
	}
	return store.Grant{}, false, fmt.Errorf("%w: etcdstore: revoke %q: the slots kept changing", store.ErrContention, key)
}

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
