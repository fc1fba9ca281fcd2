package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/internal/deadlock"
)

// Semaphores and read/write locks (C2 #ct2-multi). A key of either kind
// lives under m/<key>\x00, apart from the plain grant and queue keys:
//
//	m/<key>\x00s<session>  a slot: "<mode> <limit> <session> <unix ns>" on the
//	                       holder's lease; its mod revision is the token
//	m/<key>\x00w<session>  a waiter: "<mode> <limit> <session>" on the
//	                       waiter's lease, with a fourth field "1" when it
//	                       opted out of deadlock refusal (deadlock.go);
//	                       create revision orders the queue
//	m/<key>\x00v<session>  a slot's value: "<token> <value>" on the lease
//
// Every grant or queueing is one transaction that compares the whole
// m/<key>\x00 range against the snapshot it decided on (no key in it newer
// than that revision) and that the key's plain grant and plain queue are
// empty (deletes need no snapshot: a release compares its own slot, a
// revoke deletes the whole slot range, revokeMulti); the plain grant paths
// in turn require the m/ range to be empty (ifFree, and Acquire's
// queueing). So the two kinds never hold one key at once, and a
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
// for the key k names as a semaphore or read/write lock.
func ifMultiFree(k keyBytes) *pb.Compare {
	return cmpCreateBytes(k.multi, k.multiEnd, pb.Compare_EQUAL, 0)
}

// getMultiAny reads whether the key k names has semaphore or read/write
// entries.
func getMultiAny(k keyBytes) *pb.RequestOp { return reqAnyIn(k.multi, k.multiEnd) }

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
		// fromEvents: rng was updated from watch events since the read.
		fromEvents bool
		myRev      int64 // the create revision of the session's waiter key
		// wsp is the wait's span from the first attempt not admitted (C4
		// #ct4-traces); nil when untraced or not waiting.
		wsp  *telemetry.Span
		octx = ctx
		// dw is the wait under the deadlock detector (C2 #ct2-deadlock),
		// registered once queued unless it opted out; a refusal cancels
		// ctx through cancel.
		dw     *deadlock.Wait
		cancel context.CancelFunc
	)
	defer func() {
		w.close()
		if dw != nil {
			if de := dw.Err(); de != nil && err != nil && octx.Err() == nil {
				err = de // refused; a grant that came first wins
			}
			dw.Done()
		}
		if queued && err != nil {
			s.leaveMulti(ss, key, myRev)
		}
		wsp.EndWait(octx, err)
	}()
	if wait && !o.NoDeadlockCheck {
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
	}
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
			rev, seen, read, fromEvents = resp.Header.Revision, resp.Header.Revision, false, false
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
				if queued && e.kv.CreateRevision > myRev {
					// Handed over by a release (handover.go): this
					// call's grant.
					g, err := s.slotGranted(ss, key, e.kv.ModRevision, e.at, start)
					return g, err == nil, err
				}
				// Held already: that grant, at once.
				return s.withRemaining(ss, store.Grant{Key: key, Session: ss.id, Token: s.token(e.kv.ModRevision), AcquiredAt: e.at}, start), true, nil
			}
		}
		mine := slices.IndexFunc(st.waiters, func(e slotEntry) bool { return e.Session == ss.id })
		if queued && mine < 0 {
			if fromEvents {
				// A hand-over's events may arrive in two responses: the
				// range itself decides.
				read = true
				continue
			}
			return store.Grant{}, false, s.waiterGone(ctx, ss)
		}
		if mine >= 0 {
			myRev = st.waiters[mine].kv.CreateRevision
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
		if wsp == nil {
			ctx, wsp = telemetry.StartWait(ctx, "etcd") // stays nil when untraced: called again, allocates nothing
		}
		if mine < 0 {
			tr, err := s.cli.Txn(ctx).If(append(unchanged, stillThere(st)...)...).Then(
				clientv3.OpPut(wk, mwaiterValue(ss.id, o), clientv3.WithLease(ss.lease)),
			).Commit()
			if err != nil {
				return store.Grant{}, false, s.sessionErr(ctx, ss, err)
			}
			queued = queued || tr.Succeeded
			read = true // decide again with our place in the queue
			continue
		}
		queued = true
		if dw == nil && cancel != nil {
			dw = s.deadlocks.Register(ss.id, key, cancel)
		}
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
					rev, fromEvents = ev.Kv.ModRevision, true
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
// otherwise. A slot a release handed to this call meanwhile (created after
// the waiter entry, myRev) nobody claims: it goes too, and its freed slot
// to the waiters it admits.
func (s *Store) leaveMulti(ss *session, key string, myRev int64) {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	wk, sk := s.mwaiterKey(key, ss.id), s.slotKey(key, ss.id)
	if myRev == 0 {
		s.cli.Delete(ctx, wk) //nolint:errcheck // best effort
		return
	}
	tr, err := s.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.LeaseValue(sk), "=", ss.lease),
		clientv3.Compare(clientv3.CreateRevision(sk), ">", myRev),
	).Then(clientv3.OpDelete(wk), clientv3.OpDelete(sk), clientv3.OpDelete(s.slotValueKey(key, ss.id))).
		Else(clientv3.OpDelete(wk)).Commit()
	if err == nil && tr.Succeeded {
		if st, _, err := s.readRange(ctx, key); err == nil {
			s.handOverRest(ctx, key, st) //nolint:errcheck // best effort: the waiters' own attempts remain
		}
	}
}

// isMulti reports whether the session's grant of key is a slot.
func (s *Store) isMulti(ss *session, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ss.multi[key]
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
