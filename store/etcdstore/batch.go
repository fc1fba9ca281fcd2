package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Group commit. Grants and releases (one conditional transaction on one
// lockd key each) go through a queue; up to maxInflight committer
// goroutines of the Store take what is queued and commit it as ONE etcd Txn
// whose operations are the requests' own transactions, nested
// (clientv3.OpTxn) under an outer Txn without compares. See the package doc.

const (
	// maxBatch caps the requests of one commit. etcd allows --max-txn-ops
	// (default 128) operations per level of a Txn, and a nested Txn only
	// what its parent level leaves over; every request of this package
	// needs at most 4 per level. 64 requests of at most a few KiB stay far
	// below etcd's 1.5 MiB request limit.
	maxBatch = 64
	// maxInflight is how many batches may be committing at once. A request
	// arriving while every committer is busy waits for the next batch, so
	// batches grow with the load and nothing ever waits for a timer.
	maxInflight = 2
	// commitTimeout bounds one commit. It runs on the Store's context, not
	// a caller's; each caller waits for its own result or its own ctx.
	commitTimeout = 5 * time.Second
)

// Request states: a request is queued until a committer takes it (sent),
// unless its caller gives up first (dropped: never sent).
const (
	reqQueued int32 = iota
	reqSent
	reqDropped
)

// txnReq is one caller's conditional transaction on one lockd key. Every
// etcd key it touches belongs to that lockd key (its grant, marker and
// waiter keys), so requests on distinct keys never touch the same etcd key
// and can share a commit.
type txnReq struct {
	key       string
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
	state     atomic.Int32
	res       chan txnResult // capacity 1: a committer never blocks on it
}

type txnResult struct {
	resp *clientv3.TxnResponse
	err  error
}

// batcher is the Store's commit queue.
type batcher struct {
	kick chan struct{} // a request was queued or keys were freed; capacity 1

	mu    sync.Mutex
	queue []*txnReq           // arrival order
	busy  map[string]struct{} // keys of requests being committed
	limit int                 // current cap of a batch (lowered if etcd refuses a size)

	// hookFn, set by tests, is called by the committer with each batch's
	// keys before sending it.
	hookFn func(keys []string)
}

func newBatcher() *batcher {
	return &batcher{kick: make(chan struct{}, 1), busy: make(map[string]struct{}), limit: maxBatch}
}

func (b *batcher) poke() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// take forms the next batch: queued requests in arrival order, skipping
// (and keeping queued, in order) any whose key is already in this batch or
// in one being committed, and discarding dropped ones. The keys it returns
// are busy until done. hook is hookFn.
func (b *batcher) take() (batch []*txnReq, hook func([]string)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	inBatch := make(map[string]struct{})
	keep := b.queue[:0]
	for i, r := range b.queue {
		if len(batch) == b.limit {
			keep = append(keep, b.queue[i:]...)
			break
		}
		if r.state.Load() == reqDropped {
			continue
		}
		_, busy := b.busy[r.key]
		_, dup := inBatch[r.key]
		if busy || dup || !r.state.CompareAndSwap(reqQueued, reqSent) {
			if r.state.Load() != reqDropped {
				keep = append(keep, r)
			}
			continue
		}
		inBatch[r.key] = struct{}{}
		batch = append(batch, r)
	}
	clear(b.queue[len(keep):])
	b.queue = keep
	for k := range inBatch {
		b.busy[k] = struct{}{}
	}
	return batch, b.hookFn
}

// done frees a committed batch's keys.
func (b *batcher) done(batch []*txnReq) {
	b.mu.Lock()
	for _, r := range batch {
		delete(b.busy, r.key)
	}
	more := len(b.queue) > 0
	b.mu.Unlock()
	if more {
		b.poke()
	}
}

// committer takes and commits batches until Close cancels s.ctx. Requests
// still queued then are answered by their callers (errClosed); a batch it
// took is always answered.
func (s *Store) committer() {
	defer s.wg.Done()
	for {
		if batch, hook := s.batch.take(); len(batch) > 0 {
			if hook != nil {
				keys := make([]string, len(batch))
				for i, r := range batch {
					keys[i] = r.key
				}
				hook(keys)
			}
			s.commitBatch(batch)
			s.batch.done(batch)
			continue
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.batch.kick:
		}
	}
}

// commitBatch commits batch as one Txn and answers every request. When etcd
// refuses the whole Txn for a reason that may belong to one request (a
// dead session's lease, too many operations, too large, anything it does
// not classify as transient) every request is committed on its own instead,
// so each gets its own answer.
func (s *Store) commitBatch(batch []*txnReq) {
	s.met.Batch(telemetry.BatchLocks, len(batch))
	ctx, cancel := context.WithTimeout(s.ctx, commitTimeout)
	defer cancel()
	if len(batch) == 1 {
		s.commitOne(ctx, batch[0])
		return
	}
	ops := make([]clientv3.Op, len(batch))
	for i, r := range batch {
		ops[i] = clientv3.OpTxn(r.cmps, r.then, r.els)
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err == nil {
		for i, r := range batch {
			tr := resp.Responses[i].GetResponseTxn()
			// A nested response has no header of its own; the revision
			// is the batch's.
			r.res <- txnResult{resp: &clientv3.TxnResponse{Header: resp.Header, Succeeded: tr.Succeeded, Responses: tr.Responses}}
		}
		return
	}
	if !splittable(err) {
		err = s.commitErr(ctx, err)
		for _, r := range batch {
			r.res <- txnResult{err: err}
		}
		return
	}
	ee := rpctypes.Error(err)
	if errors.Is(ee, rpctypes.ErrTooManyOps) || errors.Is(ee, rpctypes.ErrRequestTooLarge) {
		s.batch.mu.Lock()
		s.batch.limit = max(min(s.batch.limit, len(batch))/2, 1)
		s.batch.mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, r := range batch {
		wg.Add(1)
		go func() { // exits when its commit returns (bounded by ctx)
			defer wg.Done()
			s.commitOne(ctx, r)
		}()
	}
	wg.Wait()
}

// commitOne commits one request as its own Txn.
func (s *Store) commitOne(ctx context.Context, r *txnReq) {
	resp, err := s.cli.Txn(ctx).If(r.cmps...).Then(r.then...).Else(r.els...).Commit()
	r.res <- txnResult{resp: resp, err: s.commitErr(ctx, err)}
}

// commitErr turns a commit's failure caused by Close into errClosed, and
// one caused by the commit's own timeout into ErrUnavailable without the
// context error in its chain: a caller must not mistake it for its own ctx
// ending.
func (s *Store) commitErr(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case s.ctx.Err() != nil:
		return errClosed
	case ctx.Err() != nil:
		return fmt.Errorf("%w: etcdstore: commit not answered within %v", store.ErrUnavailable, commitTimeout)
	}
	return err
}

// splittable reports whether a failed batch should be retried request by
// request: the failure may be one request's (a lease that no longer exists
// fails the whole Txn), or the batch's size.
func splittable(err error) bool {
	if store.IsRetryable(classify(context.Background(), err)) {
		return false // etcd unreachable or busy: every request alike
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// txn commits the conditional transaction If(cmps) Then(then) Else(els) on
// key through the group commit and returns what etcd answered for it, as
// clientv3's Txn(...).Commit() would; its Header.Revision is the revision
// of the commit.
//
// If ctx ends before the request is sent, it is dropped and the ctx error
// returned. If ctx ends while it is in flight, the outcome is unknown: the
// ctx error is returned and, when orphan is not nil, orphan is called with
// the result once it arrives (on a goroutine of the Store; not after Close),
// so the caller's cleanup sees what really happened.
func (s *Store) txn(ctx context.Context, key string, cmps []clientv3.Cmp, then, els []clientv3.Op, orphan func(*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.ctx.Err() != nil {
		return nil, errClosed
	}
	r := &txnReq{key: key, cmps: cmps, then: then, els: els, res: make(chan txnResult, 1)}
	s.batch.mu.Lock()
	s.batch.queue = append(s.batch.queue, r)
	s.batch.mu.Unlock()
	s.batch.poke()

	var gaveUp error
	select {
	case res := <-r.res:
		return res.resp, res.err
	case <-ctx.Done():
		gaveUp = ctx.Err()
	case <-s.ctx.Done():
		gaveUp = errClosed
	}
	if r.state.CompareAndSwap(reqQueued, reqDropped) {
		return nil, gaveUp // never sent
	}
	select {
	case res := <-r.res: // answered meanwhile: the outcome is known
		return res.resp, res.err
	default:
	}
	if gaveUp == errClosed {
		res := <-r.res // the committer answers soon: its commit runs on s.ctx
		return res.resp, res.err
	}
	if orphan != nil {
		s.mu.Lock()
		if !s.closed {
			s.wg.Add(1)
			go func() { // exits once the committer answers (bounded by commitTimeout)
				defer s.wg.Done()
				res := <-r.res
				orphan(res.resp, res.err)
			}()
		}
		s.mu.Unlock()
	}
	return nil, gaveUp
}
