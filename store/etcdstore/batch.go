package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/internal/groupcommit"
)

// Group commit. Grants and releases (one conditional transaction on one
// lockd key each) go through a queue; up to maxInflight committer
// goroutines of the Store take what is queued and commit it as ONE etcd Txn
// whose operations are the requests' own transactions, nested under an
// outer Txn without compares. See the package doc. The requests are etcd's
// protobufs, sent on s.kv (request.go: no copies of their compares).

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

// txnReq is one caller's conditional transaction on one lockd key. Every
// etcd key it touches belongs to that lockd key (its grant, marker and
// waiter keys), so requests on distinct keys never touch the same etcd key
// and can share a commit. The committer sets resp and err.
type txnReq struct {
	txn  pb.TxnRequest
	resp *clientv3.TxnResponse
	err  error
}

// committer takes and commits batches until Close closes the queue. Jobs
// still queued then are answered with errClosed; a batch it took is always
// answered.
func (s *Store) committer() {
	defer s.wg.Done()
	for {
		batch := s.batch.Next()
		if batch == nil {
			return
		}
		if hook := s.commitHook.Load(); hook != nil {
			keys := make([]string, len(batch))
			for i, j := range batch {
				keys[i] = j.Key()
			}
			(*hook)(keys)
		}
		reqs := groupcommit.Reqs(batch)
		sp := telemetry.StartCommit("etcd", len(batch), groupcommit.Traced(batch)) // nil: untraced (C4 #ct4-traces)
		s.commitBatch(reqs)
		sp.EndCommit(firstErr(reqs))
		s.batch.Finish(batch) // a caller that gave up settles its request itself (txn)
	}
}

// commitBatch commits batch as one Txn and sets every request's result. When etcd
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
	ops := make([]*pb.RequestOp, len(batch))
	nested := make([]pb.RequestOp_RequestTxn, len(batch))
	for i, r := range batch {
		nested[i].RequestTxn = &r.txn
		ops[i] = &pb.RequestOp{Request: &nested[i]}
	}
	resp, err := s.kvTxn(ctx, &pb.TxnRequest{Success: ops})
	if err == nil {
		for i, r := range batch {
			tr := resp.Responses[i].GetResponseTxn()
			// A nested response has no header of its own; the revision
			// is the batch's.
			r.resp = &clientv3.TxnResponse{Header: resp.Header, Succeeded: tr.Succeeded, Responses: tr.Responses}
		}
		return
	}
	if !splittable(err) {
		err = s.commitErr(ctx, err)
		for _, r := range batch {
			r.err = err
		}
		return
	}
	ee := rpctypes.Error(err)
	if errors.Is(ee, rpctypes.ErrTooManyOps) || errors.Is(ee, rpctypes.ErrRequestTooLarge) {
		s.batch.Shrink(len(batch))
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

// firstErr is the first request's error of a committed batch, for its span.
func firstErr(reqs []*txnReq) error {
	for _, r := range reqs {
		if r.err != nil {
			return r.err
		}
	}
	return nil
}

// commitOne commits one request as its own Txn.
func (s *Store) commitOne(ctx context.Context, r *txnReq) {
	resp, err := s.kvTxn(ctx, &r.txn)
	r.resp, r.err = resp, s.commitErr(ctx, err)
}

// kvTxn sends one TxnRequest on s.kv and answers as clientv3's
// Txn(...).Commit() does (its response type; a ctx error as ctx's).
func (s *Store) kvTxn(ctx context.Context, req *pb.TxnRequest) (*clientv3.TxnResponse, error) {
	resp, err := s.kv.Txn(ctx, req, kvCallOpts...)
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return (*clientv3.TxnResponse)(resp), nil
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
// returned. If ctx ends while it is in flight, txn waits for its commit
// (bounded by commitTimeout) and, when orphan is not nil, calls orphan with
// the result, so that the caller's cleanup sees what really happened and is
// done before the call returns (C2 #ct2-leave-after-cut); then it returns
// the ctx error.
func (s *Store) txn(ctx context.Context, key string, cmps []*pb.Compare, then, els []*pb.RequestOp, orphan func(*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.ctx.Err() != nil {
		return nil, errClosed
	}
	r := &txnReq{txn: pb.TxnRequest{Compare: cmps, Success: then, Failure: els}}
	j, err := s.batch.Submit(ctx, key, r)
	if err != nil {
		return nil, err
	}
	ran, err := s.batch.Wait(ctx, j)
	switch {
	case err == nil: // committed: the outcome is known
		return r.resp, r.err
	case !ran:
		return nil, err // never sent (the caller gave up, or Close)
	}
	if orphan != nil {
		orphan(r.resp, r.err) // before the call returns (C2 #ct2-leave-after-cut)
	}
	return nil, err
}
