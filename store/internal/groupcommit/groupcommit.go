// Package groupcommit is the group-commit queue of both backends: callers
// submit requests, and the backend's workers take whatever is queued as
// one batch whenever they are free, commit it as one backend request and
// answer every caller. There is no linger: an idle worker takes a lone
// request at once, and requests that arrive while every worker is busy form
// the next batch. Requests with the same key go out in arrival order, one
// per batch, and never in two batches at once.
//
// A request's life: queued (waiting to join a batch) → sent (in a batch
// being run) → done (answered); a queued request whose caller gives up is
// answered at once and never sent; a sent one whose caller gives up still
// runs, and its caller waits for its batch (bounded by one commit) so that
// it can settle what the request did (pgstore undoes a queue place,
// etcdstore runs the call's cleanup) before it returns: no call returns
// with a write of its own still to come (C2 #ct2-leave-after-cut). Settle
// waits until every job of a key submitted before it is answered, so that
// a write of that key by another caller (a LeaveQueue while the cut call's
// handler still runs) lands after whatever a cut call's job commits.
package groupcommit

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/trace"
)

// state is where a job is in its queue.
type state int

const (
	queued state = iota // waiting to join a batch
	sent                // in a batch being run
	done                // answered: result in Req, or err
)

// Job is one caller's request in a Queue. The caller owns Req until it
// submits the job and again once Done is closed; the batch in between: a
// worker writes the result into Req before Finish.
type Job[T any] struct {
	Req T

	ctx   context.Context // the caller's: a job whose caller is gone is not sent
	key   string          // jobs with the same non-empty key never share a batch
	state state           // guarded by the queue's mu
	err   error           // set when the job was answered without being run
	done  chan struct{}   // closed when answered
}

// Key is the key the job was submitted with.
func (j *Job[T]) Key() string { return j.key }

// Done is closed once the job is answered.
func (j *Job[T]) Done() <-chan struct{} { return j.done }

// Queue is the group commit of one kind of request.
type Queue[T any] struct {
	closedErr error

	mu      sync.Mutex
	cond    sync.Cond
	maxSize int // current cap of a batch (Shrink lowers it)
	pending []*Job[T]
	running map[string]*Job[T] // the job being run of each busy key
	closed  bool
	// settling, when set (tests), is called by Settle once it has found
	// jobs of its key to wait for, and by Wait for a cut caller's job in
	// flight, before they wait.
	settling func(key string)
}

// New returns a queue whose batches hold at most maxSize jobs; closedErr
// answers every job still queued when it is closed, and every later Submit.
func New[T any](maxSize int, closedErr error) *Queue[T] {
	q := &Queue[T]{maxSize: max(maxSize, 1), closedErr: closedErr, running: make(map[string]*Job[T])}
	q.cond.L = &q.mu
	return q
}

// Submit queues a request of the caller's ctx, or returns the queue's
// closed error once it is closed.
func (q *Queue[T]) Submit(ctx context.Context, key string, req T) (*Job[T], error) {
	j := &Job[T]{ctx: ctx, key: key, Req: req, done: make(chan struct{})}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, q.closedErr
	}
	q.pending = append(q.pending, j)
	q.cond.Signal()
	return j, nil
}

// SubmitAll queues one request per element of reqs, all of the caller's
// ctx and the same key, at once: a worker takes them in one batch (up to
// the queue's batch cap, and with a non-empty key one per batch as ever),
// never some of them before the others are queued. It returns the queue's
// closed error, and queues nothing, once the queue is closed.
func (q *Queue[T]) SubmitAll(ctx context.Context, key string, reqs []T) ([]*Job[T], error) {
	jobs := make([]*Job[T], len(reqs))
	for i, r := range reqs {
		jobs[i] = &Job[T]{ctx: ctx, key: key, Req: r, done: make(chan struct{})}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, q.closedErr
	}
	q.pending = append(q.pending, jobs...)
	q.cond.Broadcast()
	return jobs, nil
}

// Wait waits until j is answered or ctx ends. It returns nil with the result
// in j.Req once a worker ran it; the error it was answered with when it was
// answered without running (its caller's ctx ended while it was queued, or
// the queue closed); or, when ctx ends first, ctx's error. If j's batch is
// being run when ctx ends, Wait still waits for that batch (bounded by one
// commit: the backend's worker bounds it) and returns ran true: j ran, its
// result is in j.Req, and the caller, who gave up, settles what it did
// before returning (C2 #ct2-leave-after-cut).
func (q *Queue[T]) Wait(ctx context.Context, j *Job[T]) (ran bool, err error) {
	select {
	case <-j.done:
		return false, j.err
	case <-ctx.Done():
	}
	q.mu.Lock()
	switch j.state {
	case queued:
		for i, p := range q.pending {
			if p == j {
				q.pending = append(q.pending[:i], q.pending[i+1:]...)
				break
			}
		}
		q.answerLocked(j, ctx.Err())
		q.mu.Unlock()
		return false, ctx.Err()
	case sent:
		hook := q.settling
		q.mu.Unlock()
		if hook != nil {
			hook(j.key)
		}
		<-j.done // Finish closes it once the batch has run
		return true, ctx.Err()
	}
	q.mu.Unlock()
	return false, j.err // answered meanwhile: as if before ctx ended
}

// answerLocked answers j without running it. q.mu is held.
func (q *Queue[T]) answerLocked(j *Job[T], err error) {
	j.state, j.err = done, err
	close(j.done)
}

// Next blocks until it can take a batch, and returns it; nil once the queue
// is closed. Jobs whose callers are gone are answered and dropped; the rest
// join in arrival order, skipping (and so keeping in place) any whose key is
// already in this batch or in one being run. The batch's keys are busy
// until Finish.
func (q *Queue[T]) Next() []*Job[T] {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.closed {
			return nil
		}
		var batch []*Job[T]
		var keys map[string]struct{}
		rest := q.pending[:0]
		for _, j := range q.pending {
			if err := j.ctx.Err(); err != nil {
				q.answerLocked(j, err)
				continue
			}
			if len(batch) < q.maxSize && !q.keyTaken(keys, j.key) {
				if j.key != "" {
					if keys == nil {
						keys = make(map[string]struct{})
					}
					keys[j.key] = struct{}{}
				}
				j.state = sent
				batch = append(batch, j)
				continue
			}
			rest = append(rest, j)
		}
		clear(q.pending[len(rest):])
		q.pending = rest
		if len(batch) > 0 {
			for _, j := range batch {
				if j.key != "" {
					q.running[j.key] = j
				}
			}
			return batch
		}
		q.cond.Wait()
	}
}

// Reqs returns the requests of a batch, in its order.
func Reqs[T any](batch []*Job[T]) []T {
	reqs := make([]T, len(batch))
	for i, j := range batch {
		reqs[i] = j.Req
	}
	return reqs
}

func (q *Queue[T]) keyTaken(keys map[string]struct{}, key string) bool {
	if key == "" {
		return false
	}
	_, inBatch := keys[key]
	_, running := q.running[key]
	return inBatch || running
}

// Finish answers every job of a batch that has run (results already in
// Req) and frees their keys. A job whose caller gave up while the batch ran
// is answered too: its caller waits in Wait and settles it.
func (q *Queue[T]) Finish(batch []*Job[T]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range batch {
		if j.key != "" {
			delete(q.running, j.key)
		}
		j.state = done
		close(j.done)
	}
	q.cond.Broadcast() // freed keys may let queued jobs go
}

// Settle waits until every job of key (not empty) submitted before the
// call is answered: run, its batch finished, or dropped because its caller
// gave up before it was sent. It returns ctx's error if ctx ends first.
// Jobs submitted after the call are not waited for.
//
// A caller that gave up waits for its job in flight (Wait), but another
// caller's write of the same key may come first — a LeaveQueue while the
// cut Acquire's call is still waiting — and must land after it (C2
// #ct2-leave-after-cut): it settles the key first.
func (q *Queue[T]) Settle(ctx context.Context, key string) error {
	q.mu.Lock()
	var wait []*Job[T]
	if j, ok := q.running[key]; ok {
		wait = append(wait, j)
	}
	for _, j := range q.pending {
		if j.key == key {
			wait = append(wait, j)
		}
	}
	hook := q.settling
	q.mu.Unlock()
	if len(wait) > 0 && hook != nil {
		hook(key)
	}
	for _, j := range wait {
		select {
		case <-j.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// SetSettling sets the hook Settle calls once it has jobs to wait for
// (tests only; nil removes it).
func (q *Queue[T]) SetSettling(hook func(key string)) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.settling = hook
}

// Shrink lowers the cap of later batches after the backend refused a batch
// of n jobs for its size: to half of n (or of the cap, if lower), at least
// one.
func (q *Queue[T]) Shrink(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.maxSize = max(min(q.maxSize, n)/2, 1)
}

// Close answers every queued job with the closed error and makes Next
// return nil. Batches being run finish.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for _, j := range q.pending {
		q.answerLocked(j, q.closedErr)
	}
	q.pending = nil
	q.cond.Broadcast()
}

// Queued is the number of jobs waiting for a batch.
func (q *Queue[T]) Queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}

// Traced returns the contexts of the jobs of batch whose callers are traced
// (their context carries a valid OpenTelemetry span context), in batch
// order, or nil when none is: the callers of a commit span (C4
// #ct4-traces). With tracing off it allocates nothing.
func Traced[T any](batch []*Job[T]) []context.Context {
	var out []context.Context
	for _, j := range batch {
		if trace.SpanContextFromContext(j.ctx).IsValid() {
			out = append(out, j.ctx)
		}
	}
	return out
}
