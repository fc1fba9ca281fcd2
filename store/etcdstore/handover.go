package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Hand-over of a freed slot in the release (C2 #ct2-multi, "Hand-over in
// the release"; issue 24). A slot's release reads the key's m/ range and
// commits, in one transaction, the slot's delete and the grant of the
// first waiter the release admits (store.Admit): a slot key on that
// waiter's lease, its waiter key deleted. A token is a commit's revision,
// so each further admitted waiter (the readers behind a writer that
// released) gets a commit of its own, made before the release returns.
// Every such transaction compares the range against the read it decided on
// (no key newer) and the waiter key it grants (still there, same create
// revision: a waiter that left is never granted); a failed compare reads
// again. The waiter learns its grant from its watch of the range
// (acquireMulti). A session's end (the lease's deletes) and a revoke keep
// the waiters' own attempts: a lease's end runs no transaction.
//
// The hand-over is best effort within the release, which fails only when
// its caller no longer owns the slot (or etcd does not answer): when the
// range keeps changing under handOverTries attempts, the slot goes by the
// owner compares alone and the waiters it admits are granted after it, as
// handOverRest grants further readers. A waiter left admissible (that
// hand-over failed) is woken by the delete in its watch of the range and
// takes its grant itself, as every waiter did before the hand-over.

// slotHandOver is the grant of waiter e in a transaction: its slot key
// (the grant, on its lease) and its waiter key's delete, if that key is
// still the one read.
func (s *Store) slotHandOver(key string, e slotEntry) ([]clientv3.Cmp, []clientv3.Op) {
	o := store.AcquireOptions{Limit: e.Limit, Mode: e.Mode}
	wk := string(e.kv.Key)
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(wk), "=", e.kv.CreateRevision)},
		[]clientv3.Op{
			clientv3.OpPut(s.slotKey(key, e.Session), entryValue(e.Session, o)+" "+strconv.FormatInt(time.Now().UnixNano(), 10),
				clientv3.WithLease(clientv3.LeaseID(e.kv.Lease))),
			clientv3.OpDelete(wk),
		}
}

// admitted is the first waiter of st that its holders admit now, if any.
func admitted(st multiState) (slotEntry, bool) {
	if len(st.waiters) == 0 {
		return slotEntry{}, false
	}
	w := st.waiters[0]
	o := store.AcquireOptions{Limit: w.Limit, Mode: w.Mode}
	return w, store.Admit(w.Session, o, entries(st.slots), entries(st.waiters)) == store.AdmitGrant
}

// readRange reads key's m/ range (linearizable) and its revision.
func (s *Store) readRange(ctx context.Context, key string) (multiState, int64, error) {
	resp, err := s.cli.Get(ctx, s.multiPrefix(key), clientv3.WithPrefix())
	if err != nil {
		return multiState{}, 0, classify(ctx, err)
	}
	st, err := s.decodeMulti(key, resp.Kvs)
	return st, resp.Header.Revision, err
}

// handOverTries bounds a release's attempts to hand over in its own
// transaction; then the slot (releaseMulti) or the plain grant
// (DeleteIfOwner) goes alone.
const handOverTries = 10

// releaseMulti is DeleteIfOwner of a slot: the slot's delete and the
// hand-over to the first waiter it admits in one transaction, then the
// others it admits (handOverRest). When that transaction's compares keep
// failing (handOverTries), the slot's delete alone, by the owner compares,
// then the hand-over from the range as that delete left it.
func (s *Store) releaseMulti(ctx context.Context, ss *session, key string, token uint64, notOwner error) error {
	rev, issued := s.revision(token)
	if !issued {
		return notOwner
	}
	sk := s.slotKey(key, ss.id)
	owner := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(sk), "=", rev),
		clientv3.Compare(clientv3.LeaseValue(sk), "=", ss.lease),
	}
	var (
		st   multiState // the range, once released
		done bool
	)
	st, read, err := s.readRange(ctx, key)
	if err != nil {
		return fmt.Errorf("etcdstore: release: %w", err)
	}
	for range handOverTries {
		mine := slices.IndexFunc(st.slots, func(e slotEntry) bool { return string(e.kv.Key) == sk })
		if mine < 0 || st.slots[mine].kv.ModRevision != rev || clientv3.LeaseID(st.slots[mine].kv.Lease) != ss.lease {
			return notOwner
		}
		st.slots = slices.Delete(st.slots, mine, mine+1)
		cmps := slices.Clone(owner)
		ops := []clientv3.Op{clientv3.OpDelete(sk), clientv3.OpDelete(s.slotValueKey(key, ss.id))}
		w, ok := admitted(st)
		if ok {
			c, o := s.slotHandOver(key, w)
			cmps, ops = append(cmps, c...), append(ops, o...)
		} else {
			cmps = append(cmps, s.admitsNone(key, st, read)...)
		}
		s.runHook(hookSlotReleaseTry, key)
		// Else: the range again, for the next try (no read of its own).
		tr, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(s.multiPrefix(key), clientv3.WithPrefix())).Commit()
		if err != nil {
			return fmt.Errorf("etcdstore: release: %w", classify(ctx, err))
		}
		if tr.Succeeded {
			if ok {
				st = st.granted(w)
			}
			done = true
			break
		}
		// Changed since the read (or no longer ours): decide again.
		read = tr.Header.Revision
		if st, err = s.decodeMulti(key, tr.Responses[0].GetResponseRange().Kvs); err != nil {
			return fmt.Errorf("etcdstore: release: %w", err)
		}
	}
	if !done {
		// The range kept changing under the hand-over (concurrent releases
		// aiming at the same head of the queue, waiters coming and going):
		// the slot goes by the owner compares alone, which only the owner's
		// loss fails, and the range read in the same transaction, after the
		// deletes, is what the hand-over below starts from. A release never
		// fails for contention while its caller owns the slot.
		tr, err := s.cli.Txn(ctx).If(owner...).Then(
			clientv3.OpDelete(sk), clientv3.OpDelete(s.slotValueKey(key, ss.id)),
			clientv3.OpGet(s.multiPrefix(key), clientv3.WithPrefix()),
		).Commit()
		if err != nil {
			return fmt.Errorf("etcdstore: release: %w", classify(ctx, err))
		}
		if !tr.Succeeded {
			return notOwner
		}
		if st, err = s.decodeMulti(key, tr.Responses[2].GetResponseRange().Kvs); err != nil {
			st = multiState{} // released; the waiters' own attempts remain
		}
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
	// Best effort: the slot is released; a waiter left admissible takes
	// its grant itself when its watch sees the release.
	s.handOverRest(ctx, key, st) //nolint:errcheck // see above
	return nil
}

// admitsNone is the compare of a release that hands over to nobody. With
// nobody queued in the read: nobody queued since (a waiter that queued
// meanwhile may be the one the release admits). With a first waiter the
// other holders keep out (RW: a writer behind readers, or readers behind a
// writer): the first of those holders still holds. Of several holders
// releasing at once, the last to commit then finds its compared holder
// gone, reads again and hands over; a holder whose session ends instead
// leaves it to the waiter's own attempt.
func (s *Store) admitsNone(key string, st multiState, read int64) []clientv3.Cmp {
	if len(st.waiters) == 0 || len(st.slots) == 0 {
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.mwaiterKey(key, "")), "<", read+1).WithPrefix()}
	}
	h := st.slots[0]
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(string(h.kv.Key)), "=", h.kv.CreateRevision)}
}

// granted is st with waiter w moved to the holders.
func (st multiState) granted(w slotEntry) multiState {
	st.waiters = slices.DeleteFunc(slices.Clone(st.waiters), func(e slotEntry) bool { return e.kv == w.kv })
	st.slots = append(slices.Clone(st.slots), w)
	return st
}

// handOverRest grants key's admitted waiters, one commit each, until its
// holders admit none; st is key's range as the caller knows it from its
// own commit (a holder gone since only makes it admit fewer than it could:
// that holder's release hands over; a waiter gone fails its compare: then
// the range is read again).
func (s *Store) handOverRest(ctx context.Context, key string, st multiState) error {
	for range 64 {
		w, ok := admitted(st)
		if !ok {
			return nil
		}
		// w is first in line: only its own grant or leaving (its key's
		// delete) can change what admits it.
		cmps, ops := s.slotHandOver(key, w)
		s.runHook(hookSlotReleaseTry, key)
		tr, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return classify(ctx, err)
		}
		if tr.Succeeded {
			st = st.granted(w)
			continue
		}
		if st, _, err = s.readRange(ctx, key); err != nil {
			return err
		}
	}
	return nil
}

// stillThere compares every holder and waiter of st as read: a request
// queues only while what kept it out is all still there (a delete leaves no
// key newer than the read, so the range compare alone misses it, and a
// release that read before this waiter queued hands over to nobody). With
// more entries than a transaction's compares allow, the waiter's read after
// queueing finds a slot freed meanwhile, as before.
func stillThere(st multiState) []clientv3.Cmp {
	if len(st.slots)+len(st.waiters) > 100 {
		return nil
	}
	cmps := make([]clientv3.Cmp, 0, len(st.slots)+len(st.waiters))
	for _, e := range append(slices.Clone(st.slots), st.waiters...) {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(string(e.kv.Key)), "=", e.kv.CreateRevision))
	}
	return cmps
}
