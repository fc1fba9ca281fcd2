package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Acquire grants key to the session, queueing it behind earlier waiters.
//
// Hand-over takes one commit: a release with sessions queued hands the key
// straight to the first waiter in its own transaction (DeleteIfOwner), and
// the waiter learns it from a watch event or, when it waits on this Store,
// from the release's commit result (wait; C2 #ct2-release-handover). A
// waiter watches only its predecessor's waiter key, and the first two in
// line the grant key too, so
// a release wakes at most two waiters, never the whole queue. Each watch
// starts at the current revision and the state is read again once it
// exists: a watch that starts at a revision the server has passed is only
// served by etcd's periodic resync of lagging watchers (every 100 ms).
//
// With store.KeepPlace (C2 #ct2-keep-place) a call that ends without a grant
// leaves its waiter key in place, unless the session ended or the wait was
// refused as a deadlock's victim (checkedWait): the next call re-puts it,
// keeping its create revision (the place), or finds the key handed over.
func (s *Store) Acquire(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (g store.Grant, err error) {
	keep := store.KeepsPlace(opts)
	start := time.Now()
	defer s.met.Observe(telemetry.OpAcquire)(&err)
	defer func() { s.met.Acquire(telemetry.AcquireResult(ctx, err), time.Since(start)) }()
	if err := store.ValidateKey(key); err != nil {
		return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", err)
	}
	o, err := store.NewAcquireOptions(opts...)
	if err != nil {
		return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", err)
	}
	ss, err := s.live(ctx, id)
	if err != nil {
		return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", err)
	}
	defer s.keep.use(ss)() // an adopted session stays kept while it waits
	if o.Multi() {
		g, _, err := s.acquireMulti(ctx, ss, key, o, true, start) // multi.go
		if err != nil {
			return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", err)
		}
		return g, nil
	}
	k, wk := s.keyBytesOf(key), s.waiterKey(key, id)
	at := time.Now()
	resp, err := s.txn(ctx, key, ifFree(k),
		[]*pb.RequestOp{putGrant(ss, k, at)},
		[]*pb.RequestOp{
			reqGet(k.lock),
			// Queue up, unless the session holds the key already or the
			// key is a semaphore or read/write lock (multi.go).
			reqTxn(
				[]*pb.Compare{cmpLease(k.lock, pb.Compare_NOT_EQUAL, ss.lease), ifMultiFree(k)},
				[]*pb.RequestOp{reqPut(wk, waiterValue(id, o.NoDeadlockCheck), ss.lease, true)},
				nil),
			getMultiAny(k),
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
			case keep:
				// The place stays for the next call (C2 #ct2-keep-place).
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
		if len(kvs) == 0 && len(resp.Responses[2].GetResponseRange().Kvs) > 0 {
			return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", errMismatch(key, o))
		}
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
	wctx, wsp := telemetry.StartWait(ctx, "etcd")                          // nil: untraced (C4 #ct4-traces)
	g, err = s.checkedWait(wctx, ss, key, myRev, start, o.NoDeadlockCheck) // deadlock.go
	wsp.EndWait(ctx, err)
	if errors.Is(err, store.ErrDeadlock) {
		return store.Grant{}, fmt.Errorf("etcdstore: acquire: %w", err)
	}
	if err != nil {
		if !keep || ss.isDone() {
			s.leave(ss, key, myRev)
		}
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
// releasing holder, or taken by this session once it is first in line and
// the key is free.
//
// A hand-over by a release of this Store is told from the release's commit
// result (localQueues.handOver, C2 #ct2-release-handover): it ends the
// wait's context, and the grant it names is the answer, with no watch
// event and no further round trip. Any other hand-over is seen in the
// watch event itself (waitLoop), which also stays the net for this Store's
// own: whichever comes first answers, once — the loser finds the call
// returned (a tell) or its context ended (the watch path).
func (s *Store) wait(ctx context.Context, ss *session, key string, myRev int64, start time.Time) (store.Grant, error) {
	wctx, wake := context.WithCancelCause(ctx)
	defer wake(nil)
	lw0 := &localWaiter{ss: ss, rev: myRev, wake: wake}
	defer s.waiters.add(key, lw0)()
	g, err := s.waitLoop(wctx, ss, key, myRev, start, lw0)
	if err == nil {
		return g, nil
	}
	// A call whose own ctx ended answers that, and Acquire's leave takes
	// the grant back (a grant nobody returned).
	if h, ok := s.waiters.handedOff(lw0); ok && ctx.Err() == nil {
		return s.granted(ss, key, h.rev, h.at, start)
	}
	return store.Grant{}, err
}

// waitLoop is wait's reads and watches. A waiter watches its predecessor's
// waiter key. The first two in line also watch the grant key, armed before
// they are first, so the waiter next in line does not have to set up a
// watch while the key is being handed to it; the hand-over's event carries
// the grant (no further round trip).
func (s *Store) waitLoop(ctx context.Context, ss *session, key string, myRev int64, start time.Time, lw0 *localWaiter) (store.Grant, error) {
	lk, wk, qp, dk := s.lockKey(key), s.waiterKey(key, ss.id), s.queuePrefix(key), s.delayKey(key)
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
			clientv3.OpGet(dk, clientv3.WithKeysOnly()),
		).Commit()
		if err != nil {
			return store.Grant{}, s.sessionErr(ctx, ss, err)
		}
		lock := resp.Responses[0].GetResponseRange().Kvs
		mine := resp.Responses[1].GetResponseRange().Kvs
		ahead := resp.Responses[2].GetResponseRange().Kvs
		delayed := resp.Responses[3].GetResponseRange().Kvs
		if len(ahead) == 0 && len(mine) > 0 && mine[0].CreateRevision == myRev {
			// First in line, and nobody can get ahead any more: a release
			// through this Store may hand over to us without reading.
			s.waiters.setFirst(lw0)
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
			if s.waitingHook != nil {
				s.waitingHook(key)
			}
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
		case len(delayed) > 0:
			// First in line, the key free, a lock-delay running
			// (delay.go): wake when its record goes.
			dw, err := s.armWatch(ctx, ss, dk, clientv3.WithFilterPut())
			if err != nil {
				return store.Grant{}, err
			}
			gr, err := s.cli.Get(ctx, dk, clientv3.WithKeysOnly())
			if err == nil && len(gr.Kvs) > 0 {
				_, err = s.next(ctx, ss, dw, lw, 0)
			}
			dw.close()
			if err != nil {
				return store.Grant{}, s.sessionErr(ctx, ss, err)
			}
		default:
			// First in line and the key is free: take it, leave the queue.
			at := time.Now()
			tr, err := s.txn(ctx, key, []*pb.Compare{
				cmpCreate(lk, pb.Compare_EQUAL, 0),
				cmpCreate(wk, pb.Compare_EQUAL, myRev),
				// Every waiter of key was queued no earlier than us.
				cmpCreatePrefix(qp, pb.Compare_GREATER, myRev-1),
				cmpCreate(dk, pb.Compare_EQUAL, 0), // no lock-delay running
			}, []*pb.RequestOp{putGrant(ss, s.keyBytesOf(key), at), reqDelete(wk)}, nil,
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

// handedOver records a grant another party wrote for the session.
func (s *Store) handedOver(ss *session, key string, kv *mvccpb.KeyValue, start time.Time) (store.Grant, error) {
	held, err := s.grantOf(key, kv)
	if err != nil {
		return store.Grant{}, err
	}
	return s.granted(ss, key, kv.ModRevision, held.AcquiredAt, start)
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
				if err := s.holdEvent(ctx, ss); err != nil {
					return nil, err
				}
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
					if err := s.holdEvent(ctx, ss); err != nil {
						return nil, err
					}
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

// holdEvent holds a watch event a waiter received until the test gate
// eventGate opens (tests: the notification path held back); without a
// gate it returns at once.
func (s *Store) holdEvent(ctx context.Context, ss *session) error {
	if s.eventGate == nil {
		return nil
	}
	select {
	case <-s.eventGate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-ss.done:
		return deadErr(ss)
	case <-s.ctx.Done():
		return errClosed
	}
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
		marker, mlease, err := s.marker(ctx, key, markReleased)
		if err != nil {
			return err
		}
		_, err = s.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.LeaseValue(lk), "=", ss.lease),
			clientv3.Compare(clientv3.ModRevision(lk), ">", myRev),
		).Then(
			marker,
			clientv3.OpDelete(lk),
			clientv3.OpDelete(s.delayKey(key)),
			clientv3.OpDelete(wk),
		).Else(clientv3.OpDelete(wk)).Commit()
		s.marks.gone(err, mlease) // the next try gets a new marker lease
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
