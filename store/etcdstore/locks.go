package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// ifFree is the grant condition: nobody holds key and nobody waits for it.
// An empty range compares as a zero key-value, so the waiter compare holds
// exactly when the key's queue is empty.
func (s *Store) ifFree(key string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(s.lockKey(key)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(s.queuePrefix(key)), "=", 0).WithPrefix(),
	}
}

func (s *Store) putGrant(ss *session, key string, at time.Time) clientv3.Op {
	return clientv3.OpPut(s.lockKey(key), grantValue(ss.id, at), clientv3.WithLease(ss.lease))
}

// TryInsert grants key to the session iff it is free with nobody queued.
// The grant is one transaction; its revision is the fencing token. When
// another session holds the key, that grant is returned with acquired false.
func (s *Store) TryInsert(ctx context.Context, id store.SessionID, key string) (g store.Grant, acquired bool, err error) {
	start := time.Now()
	defer func() {
		s.met.Request(telemetry.OpTryInsert, start, err)
		switch {
		case err != nil:
			s.met.Acquire(telemetry.AcquireError, 0)
		case acquired:
			s.met.Acquire(telemetry.AcquireGranted, time.Since(start))
		default:
			s.met.Acquire(telemetry.AcquireContended, 0)
		}
	}()
	if err := store.ValidateKey(key); err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: try insert: %w", err)
	}
	ss, err := s.live(ctx, id)
	if err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: try insert: %w", err)
	}
	at := time.Now()
	// An answer lost to ctx needs no cleanup: a retry finds the grant and
	// returns it (already mine). It is recorded, though, so CloseSession
	// counts it.
	resp, err := s.txn(ctx, key, s.ifFree(key),
		[]clientv3.Op{s.putGrant(ss, key, at)},
		[]clientv3.Op{clientv3.OpGet(s.lockKey(key))},
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

// Acquire grants key to the session, queueing it behind earlier waiters.
//
// Hand-over takes one commit: a release with sessions queued hands the key
// straight to the first waiter in its own transaction (DeleteIfOwner), and
// the waiter learns it from a watch event. A waiter watches only its
// predecessor's waiter key, and the first two in line the grant key too, so
// a release wakes at most two waiters, never the whole queue. Each watch starts at the current revision and
// the state is read again once it exists: a watch that starts at a revision
// the server has passed is only served by etcd's periodic resync of lagging
// watchers (every 100 ms), which is what makes concurrency.Mutex slow to
// hand over.
func (s *Store) Acquire(ctx context.Context, id store.SessionID, key string) (g store.Grant, err error) {
	start := time.Now()
	defer func() {
		s.met.Request(telemetry.OpAcquire, start, err)
		switch {
		case err == nil:
			s.met.Acquire(telemetry.AcquireGranted, time.Since(start))
		case ctx.Err() != nil:
			s.met.Acquire(telemetry.AcquireTimeout, 0)
		default:
			s.met.Acquire(telemetry.AcquireError, 0)
		}
	}()
	if err := store.ValidateKey(key); err != nil {
		return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", err)
	}
	ss, err := s.live(ctx, id)
	if err != nil {
		return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", err)
	}
	lk, wk := s.lockKey(key), s.waiterKey(key, id)
	at := time.Now()
	resp, err := s.txn(ctx, key, s.ifFree(key),
		[]clientv3.Op{s.putGrant(ss, key, at)},
		[]clientv3.Op{
			clientv3.OpGet(lk),
			// Queue up, unless the session holds the key already.
			clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(lk), "!=", ss.lease)},
				[]clientv3.Op{clientv3.OpPut(wk, string(id), clientv3.WithLease(ss.lease), clientv3.WithPrevKV())},
				nil),
		},
		// ctx ended in flight. A grant this call made stays, as with
		// TryInsert: a retry returns it (already held). A place in the
		// queue it took is left, unless a retry queued again meanwhile
		// (its put moved the waiter key's mod revision). Only the waiter
		// key is touched: a grant of a later call must never be deleted.
		func(resp *clientv3.TxnResponse, err error) {
			switch {
			case err != nil:
			case resp.Succeeded:
				s.recordAbandoned(ss, key, resp.Header.Revision)
			case resp.Responses[1].GetResponseTxn().Succeeded:
				ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
				defer cancel()
				mine := clientv3.Compare(clientv3.ModRevision(wk), "=", resp.Header.Revision)
				s.cli.Txn(ctx).If(mine).Then(clientv3.OpDelete(wk)).Commit() //nolint:errcheck // best effort: the lease's end removes it too
			}
		})
	if err != nil {
		return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", s.sessionErr(ctx, ss, err))
	}
	if resp.Succeeded {
		return s.granted(ss, key, resp.Header.Revision, at, start)
	}
	queued := resp.Responses[1].GetResponseTxn()
	if !queued.Succeeded {
		// The session holds the key already: that grant, at once.
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", errMalformed)
		}
		held, err := s.grantOf(key, kvs[0])
		if err != nil {
			return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", err)
		}
		return s.withRemaining(ss, held, start), nil
	}
	myRev := resp.Header.Revision
	if prev := queued.Responses[0].GetResponsePut().PrevKv; prev != nil {
		myRev = prev.CreateRevision // already queued (a retried call): keep the place
	}
	g, err = s.wait(ctx, ss, key, myRev, start)
	if err != nil {
		s.leave(ss, key, myRev)
		return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", err)
	}
	s.mu.Lock()
	if !ss.dead {
		ss.queued[key] = true
	}
	s.mu.Unlock()
	return g, nil
}

// wait waits in key's queue, where the session's waiter key has create
// revision myRev, until the session is granted the key: handed over by the
// releasing holder (seen in the watch event itself, no further round trip),
// or taken by this session once it is first in line and the key is free.
//
// A waiter watches its predecessor's waiter key. The first two in line also
// watch the grant key, armed before they are first, so the waiter next in
// line does not have to set up a watch while the key is being handed to it.
func (s *Store) wait(ctx context.Context, ss *session, key string, myRev int64, start time.Time) (store.Grant, error) {
	lk, wk, qp := s.lockKey(key), s.waiterKey(key, ss.id), s.queuePrefix(key)
	lw0 := &localWaiter{ss: ss, rev: myRev}
	defer s.waitingFor(key, lw0)()
	var lw *keyWatch // on the grant key, once we are at most second in line
	defer func() { lw.close() }()
	for {
		// Read-only: no raft commit.
		resp, err := s.cli.Txn(ctx).Then(
			clientv3.OpGet(lk),
			clientv3.OpGet(wk),
			// The (at most two) waiters right ahead of us, nearest first.
			clientv3.OpGet(qp, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(myRev-1),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2)),
		).Commit()
		if err != nil {
			return store.Grant{}, s.sessionErr(ctx, ss, err)
		}
		lock := resp.Responses[0].GetResponseRange().Kvs
		mine := resp.Responses[1].GetResponseRange().Kvs
		ahead := resp.Responses[2].GetResponseRange().Kvs
		if len(ahead) == 0 && len(mine) > 0 && mine[0].CreateRevision == myRev {
			// First in line, and nobody can get ahead any more: a release
			// through this Store may hand over to us without reading.
			s.mu.Lock()
			lw0.first = true
			s.mu.Unlock()
		}
		switch {
		case len(lock) > 0 && s.owns(ss, lock[0]):
			// Handed over by the releasing holder, which also removed our
			// waiter key (or granted to a concurrent call of the same
			// session: then our waiter key is still there).
			if len(mine) > 0 {
				s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(wk), "=", myRev)).Then(clientv3.OpDelete(wk)).Commit() //nolint:errcheck // best effort; the lease's end removes it too
			}
			return s.handedOver(ss, key, lock[0], start)
		case len(mine) == 0 || mine[0].CreateRevision != myRev:
			return store.Grant{}, s.waiterGone(ctx, ss)
		case len(ahead) <= 1 && lw == nil:
			if lw, err = s.armWatch(ctx, ss, lk); err != nil {
				return store.Grant{}, err
			}
			continue // read again: later changes reach the watch
		case len(ahead) > 0:
			// Wake when the waiter right ahead leaves (granted or gone).
			pred := ahead[0]
			pw, err := s.armWatch(ctx, ss, string(pred.Key), clientv3.WithFilterPut())
			if err != nil {
				return store.Grant{}, err
			}
			gr, err := s.cli.Get(ctx, string(pred.Key))
			if err == nil && len(gr.Kvs) > 0 && gr.Kvs[0].ModRevision == pred.ModRevision {
				_, err = s.next(ctx, ss, pw, lw, 0)
			}
			pw.close()
			if err != nil {
				return store.Grant{}, s.sessionErr(ctx, ss, err)
			}
		case len(lock) > 0:
			// First in line: wake on the grant's next change.
			ev, err := s.next(ctx, ss, nil, lw, resp.Header.Revision)
			if errors.Is(err, errWatchEnded) {
				lw.close()
				lw = nil
				continue
			}
			if err != nil {
				return store.Grant{}, err
			}
			if ev != nil && ev.Type == mvccpb.PUT && s.owns(ss, ev.Kv) {
				return s.handedOver(ss, key, ev.Kv, start)
			}
		default:
			// First in line and the key is free: take it, leave the queue.
			at := time.Now()
			tr, err := s.txn(ctx, key, []clientv3.Cmp{
				clientv3.Compare(clientv3.CreateRevision(lk), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(wk), "=", myRev),
				// Every waiter of key was queued no earlier than us.
				clientv3.Compare(clientv3.CreateRevision(qp), ">", myRev-1).WithPrefix(),
			}, []clientv3.Op{s.putGrant(ss, key, at), clientv3.OpDelete(wk)}, nil,
				// ctx ended in flight: Acquire's leave takes the waiter key
				// (then this fails its compare) or, applied after it, the
				// grant (newer than myRev).
				nil)
			if err != nil {
				return store.Grant{}, s.sessionErr(ctx, ss, err)
			}
			if tr.Succeeded {
				return s.granted(ss, key, tr.Header.Revision, at, start)
			}
		}
	}
}

// localWaiter is an Acquire call of this Store waiting in a key's queue,
// with its waiter key's create revision.
type localWaiter struct {
	ss    *session
	rev   int64
	first bool // it has seen itself first in line; guarded by Store.mu
}

// waitingFor registers w as waiting for key until the returned function is
// called.
func (s *Store) waitingFor(key string, w *localWaiter) func() {
	s.mu.Lock()
	s.waiting[key] = append(s.waiting[key], w)
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		ws := s.waiting[key]
		if i := slices.Index(ws, w); i >= 0 {
			ws = slices.Delete(ws, i, i+1)
		}
		if len(ws) == 0 {
			delete(s.waiting, key)
		} else {
			s.waiting[key] = ws
		}
	}
}

// firstLocalWaiter is the guess for the first in key's queue: a live local
// waiter that has seen itself first in line (it stays first until it is
// granted the key or leaves). ok is false when this Store has none.
func (s *Store) firstLocalWaiter(key string) (w localWaiter, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.waiting[key] {
		if c.first && !c.ss.dead && (!ok || c.rev < w.rev) {
			w, ok = *c, true
		}
	}
	return w, ok
}

// handedOver records a grant another party wrote for the session.
func (s *Store) handedOver(ss *session, key string, kv *mvccpb.KeyValue, start time.Time) (store.Grant, error) {
	held, err := s.grantOf(key, kv)
	if err != nil {
		return store.Grant{}, err
	}
	return s.granted(ss, key, int64(held.Token), held.AcquiredAt, start)
}

// keyWatch is an etcd watch on one key that the server has created.
type keyWatch struct {
	ch     clientv3.WatchChan
	cancel context.CancelFunc
}

func (w *keyWatch) close() {
	if w != nil {
		w.cancel()
	}
}

// errWatchEnded: a watch ended without the caller's ctx ending; the caller
// reads the state again.
var errWatchEnded = errors.New("etcdstore: watch ended")

// armWatch creates a watch on etcdKey and waits until etcd has created it.
// It starts at the current revision, so etcd serves it at once (a watch
// from a revision the server has passed waits for the 100 ms resync). A
// change committed after armWatch returns reaches it; the caller reads the
// state afterwards to see anything earlier.
func (s *Store) armWatch(ctx context.Context, ss *session, etcdKey string, opts ...clientv3.OpOption) (*keyWatch, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	w := &keyWatch{ch: s.cli.Watch(wctx, etcdKey, append(opts, clientv3.WithCreatedNotify())...), cancel: cancel}
	select {
	case wr, ok := <-w.ch:
		if !ok || wr.Canceled || !wr.Created {
			cancel()
			return nil, s.watchEnded(ctx, wr)
		}
		return w, nil
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	case <-ss.done:
		cancel()
		return nil, deadErr(ss)
	case <-s.ctx.Done():
		cancel()
		return nil, errClosed
	}
}

// next waits for the first event on pw (any event: its key left), or for
// an event on lw after revision after. With pw set, lw's events only
// matter to keep its channel drained; next returns on pw. An event on lw
// is returned when pw is nil.
func (s *Store) next(ctx context.Context, ss *session, pw, lw *keyWatch, after int64) (*clientv3.Event, error) {
	var pch, lch clientv3.WatchChan
	if pw != nil {
		pch = pw.ch
	}
	if lw != nil {
		lch = lw.ch
	}
	for {
		select {
		case wr, ok := <-pch:
			if !ok || wr.Canceled {
				return nil, s.watchEnded(ctx, wr)
			}
			if len(wr.Events) > 0 {
				return wr.Events[0], nil
			}
		case wr, ok := <-lch:
			if !ok || wr.Canceled {
				if pw == nil {
					if err := ctx.Err(); err != nil {
						return nil, err
					}
					return nil, errWatchEnded
				}
				lch = nil // the pred watch decides; lw is rebuilt later
				continue
			}
			if pw != nil {
				continue
			}
			for _, ev := range wr.Events {
				if ev.Kv.ModRevision > after {
					return ev, nil
				}
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ss.done:
			return nil, deadErr(ss)
		case <-s.ctx.Done():
			return nil, errClosed
		}
	}
}

// watchEnded classifies a watch that ended without the awaited delete.
func (s *Store) watchEnded(ctx context.Context, wr clientv3.WatchResponse) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := wr.Err(); err != nil {
		return classify(ctx, err)
	}
	return fmt.Errorf("%w: watch closed", store.ErrUnavailable)
}

func deadErr(ss *session) error {
	return fmt.Errorf("%w: session %s ended while waiting", store.ErrSessionDead, ss.id)
}

// waiterGone handles a waiter key that vanished without the key being ours:
// the lease ended, or the key was handed to us and revoked before we saw
// it, or someone deleted the waiter key by hand.
func (s *Store) waiterGone(ctx context.Context, ss *session) error {
	resp, err := s.cli.TimeToLive(ctx, ss.lease)
	if err != nil {
		return s.sessionErr(ctx, ss, err)
	}
	if resp.TTL < 0 {
		s.markDead(ss, telemetry.LostLeaseExpired)
		return deadErr(ss)
	}
	return fmt.Errorf("%w: left the queue without a grant (a hand-over revoked at once, or the waiter key removed by hand); retry", store.ErrContention)
}

// leave removes the session's waiter key and, if this very call was granted
// the key in the meantime (the answer was lost to a cancellation), that
// grant too. It runs on its own short context: the caller's may be done.
// If etcd cannot be reached it keeps trying in the background while the
// session lives, so a dead waiter never blocks the queue.
func (s *Store) leave(ss *session, key string, myRev int64) {
	lk, wk := s.lockKey(key), s.waiterKey(key, ss.id)
	try := func(ctx context.Context) error {
		_, err := s.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.LeaseValue(lk), "=", ss.lease),
			clientv3.Compare(clientv3.ModRevision(lk), ">", myRev),
		).Then(
			clientv3.OpPut(s.markerKey(key), markReleased),
			clientv3.OpDelete(lk),
			clientv3.OpDelete(wk),
		).Else(clientv3.OpDelete(wk)).Commit()
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := try(ctx)
	cancel()
	if err == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || ss.dead {
		return // the lease's end takes the waiter key along
	}
	s.wg.Add(1)
	go func() { // exits on success, session end or Close
		defer s.wg.Done()
		delay := 100 * time.Millisecond
		for {
			t := time.NewTimer(delay)
			select {
			case <-s.ctx.Done():
				t.Stop()
				return
			case <-ss.done:
				t.Stop()
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
			err := try(ctx)
			cancel()
			if err == nil {
				return
			}
			delay = min(2*delay, time.Second)
		}
	}()
}

// recordAbandoned records a grant written for the session by a call whose
// caller gave up while it was in flight: the grant is real (a retry returns
// it), so the Store counts it as held.
func (s *Store) recordAbandoned(ss *session, key string, rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := ss.held[key]; !ok && !ss.dead {
		ss.held[key] = uint64(rev)
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
	ss.held[key] = uint64(rev)
	rem := ss.remainingLocked(start)
	s.mu.Unlock()
	s.met.LocksHeld(1)
	g := store.Grant{Key: key, Session: ss.id, Token: uint64(rev), AcquiredAt: at, Remaining: max(rem, 0)}
	s.log.LockAcquired(g, time.Since(start))
	return g, nil
}

// withRemaining fills in the session's current bound.
func (s *Store) withRemaining(ss *session, g store.Grant, start time.Time) store.Grant {
	s.mu.Lock()
	g.Remaining = max(ss.remainingLocked(start), 0)
	s.mu.Unlock()
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
	return store.Grant{Key: key, Session: holder, Token: uint64(kv.ModRevision), AcquiredAt: at}, nil
}

// sessionErr classifies err from a write with the session's lease; a
// missing lease makes the session dead.
func (s *Store) sessionErr(ctx context.Context, ss *session, err error) error {
	err = classify(ctx, err)
	if errors.Is(err, store.ErrSessionDead) {
		s.markDead(ss, telemetry.LostLeaseExpired)
	}
	return err
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
// two commits.
func (s *Store) DeleteIfOwner(ctx context.Context, id store.SessionID, key string, token uint64) (err error) {
	start := time.Now()
	defer func() { s.met.Request(telemetry.OpRelease, start, err) }()
	if err := store.ValidateKey(key); err != nil {
		return fmt.Errorf("etcdstore: release: %w", err)
	}
	ss, err := s.live(ctx, id)
	notOwner := fmt.Errorf("%w: etcdstore: release %q: token %d is not the current grant of session %s", store.ErrNotOwner, key, token, id)
	if errors.Is(err, store.ErrSessionDead) || (err == nil && (token == 0 || token > math.MaxInt64)) {
		return notOwner
	}
	if err != nil {
		return fmt.Errorf("etcdstore: release: %w", err)
	}
	lk, qp := s.lockKey(key), s.queuePrefix(key)
	owner := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(lk), "=", int64(token)),
		clientv3.Compare(clientv3.LeaseValue(lk), "=", ss.lease),
	}
	marker := clientv3.OpPut(s.markerKey(key), markReleased)
	firstInLine := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1)}
	firstWaiter := clientv3.OpGet(qp, firstInLine...)
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
	if w, ok := s.firstLocalWaiter(key); ok {
		next = &waiter{s.waiterKey(key, w.ss.id), w.rev, w.ss.lease}
	} else {
		s.mu.Lock()
		lookFirst := ss.queued[key]
		s.mu.Unlock()
		if lookFirst {
			hr, err := s.cli.Get(ctx, qp, firstInLine...)
			if err != nil {
				return fmt.Errorf("etcdstore: release: %w", classify(ctx, err))
			}
			next = fromKV(hr.Kvs)
		}
	}
	s.mu.Lock()
	delete(ss.queued, key)
	s.mu.Unlock()
	for range 10 {
		var resp *clientv3.TxnResponse
		if next == nil {
			// Release if nobody waits, else read who is first.
			resp, err = s.txn(ctx, key, owner,
				[]clientv3.Op{clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(qp), "=", 0).WithPrefix()},
					[]clientv3.Op{marker, clientv3.OpDelete(lk)},
					[]clientv3.Op{firstWaiter})},
				[]clientv3.Op{clientv3.OpGet(lk)}, nil)
		} else {
			// Hand over to next if it is still queued and first in line
			// (no waiter key of key older than its own); else read again.
			to := store.SessionID(strings.TrimPrefix(next.key, qp))
			resp, err = s.txn(ctx, key,
				append(slices.Clone(owner),
					clientv3.Compare(clientv3.CreateRevision(next.key), "=", next.rev),
					clientv3.Compare(clientv3.CreateRevision(qp), ">", next.rev-1).WithPrefix()),
				[]clientv3.Op{
					marker,
					clientv3.OpPut(lk, grantValue(to, time.Now()), clientv3.WithLease(next.lease)),
					clientv3.OpDelete(next.key),
				},
				[]clientv3.Op{clientv3.OpGet(lk), firstWaiter}, nil)
		}
		if err != nil {
			return fmt.Errorf("etcdstore: release: %w", classify(ctx, err))
		}
		if !resp.Succeeded {
			cur := resp.Responses[0].GetResponseRange().Kvs
			if len(cur) == 0 || cur[0].ModRevision != int64(token) || clientv3.LeaseID(cur[0].Lease) != ss.lease {
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
		g := store.Grant{Key: key, Session: id, Token: token}
		s.mu.Lock()
		if _, ok := ss.held[key]; ok && !ss.dead {
			delete(ss.held, key)
			s.met.Released(telemetry.ReleaseRelease, 1)
		}
		s.mu.Unlock()
		s.log.LockReleased(g, telemetry.ReleaseRelease)
		return nil
	}
	return fmt.Errorf("%w: etcdstore: release %q: its queue kept changing", store.ErrContention, key)
}

// Revoke deletes key's current grant whoever holds it, with a "revoked"
// marker in the same transaction.
func (s *Store) Revoke(ctx context.Context, key string) (g store.Grant, found bool, err error) {
	start := time.Now()
	defer func() { s.met.Request(telemetry.OpRevoke, start, err) }()
	if err := store.ValidateKey(key); err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", err)
	}
	if err := s.ready(ctx); err != nil {
		return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", err)
	}
	lk := s.lockKey(key)
	for range 10 {
		gr, err := s.cli.Get(ctx, lk)
		if err != nil {
			return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", classify(ctx, err))
		}
		if len(gr.Kvs) == 0 {
			return store.Grant{}, false, nil
		}
		g, err := s.grantOf(key, gr.Kvs[0])
		if err != nil {
			return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", err)
		}
		resp, err := s.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(lk), "=", gr.Kvs[0].ModRevision),
		).Then(
			clientv3.OpPut(s.markerKey(key), markRevoked),
			clientv3.OpDelete(lk),
		).Commit()
		if err != nil {
			return store.Grant{}, false, fmt.Errorf("etcdstore: revoke: %w", classify(ctx, err))
		}
		if !resp.Succeeded {
			continue // the grant changed under us: look again
		}
		s.log.LockRevoked(key, g.Token)
		s.mu.Lock()
		if ss := s.sessions[g.Session]; ss != nil && !ss.dead && ss.held[key] == g.Token {
			delete(ss.held, key)
			delete(ss.queued, key)
			s.met.Released(telemetry.ReleaseRevoked, 1)
			s.log.LockReleased(g, telemetry.ReleaseRevoked)
		}
		s.mu.Unlock()
		return g, true, nil
	}
	return store.Grant{}, false, fmt.Errorf("%w: etcdstore: revoke %q: the grant kept changing", store.ErrContention, key)
}

// Inspect reads key's grant and queue in one snapshot.
func (s *Store) Inspect(ctx context.Context, key string) (info store.LockInfo, found bool, err error) {
	start := time.Now()
	defer func() { s.met.Request(telemetry.OpInspect, start, err) }()
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
	).Commit()
	if err != nil {
		return store.LockInfo{}, false, fmt.Errorf("etcdstore: inspect: %w", classify(ctx, err))
	}
	info = store.LockInfo{Key: key}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		info.Waiters = append(info.Waiters, store.SessionID(strings.TrimPrefix(string(kv.Key), qp)))
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return info, false, nil
	}
	g, err := s.grantOf(key, kvs[0])
	if err != nil {
		return store.LockInfo{}, false, fmt.Errorf("etcdstore: inspect: %w", err)
	}
	info.Session, info.Token, info.AcquiredAt = g.Session, g.Token, g.AcquiredAt
	return info, true, nil
}

// List pages through held keys under prefix, with their queues, from one
// snapshot.
func (s *Store) List(ctx context.Context, prefix, after string, limit int) (_ []store.LockInfo, err error) {
	start := time.Now()
	defer func() { s.met.Request(telemetry.OpList, start, err) }()
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
	)
	// Markers sit between grant keys; page until limit grants are found.
	for len(infos) < limit && from < end {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(2*(limit-len(infos)) + 1))}
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
	queues := make(map[string][]*mvccpb.KeyValue)
	for _, kv := range resp.Kvs {
		k, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), s.prefix+"q/"), "\x00")
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
