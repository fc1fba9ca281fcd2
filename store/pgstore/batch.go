package pgstore

import (
	"context"
	"sync"
)

// jobState is where a job is in its batch queue.
type jobState int

const (
	jobQueued    jobState = iota // waiting to join a batch
	jobSent                      // in a batch being run
	jobAbandoned                 // in a batch being run, its caller gone
	jobDone                      // answered: result in the job, or err
)

// job is one caller's request in a batchQueue. The caller owns req until it
// submits the job and again once done is closed; the batch in between.
type job[T any] struct {
	ctx   context.Context // the caller's: a job whose caller is gone is not sent
	key   string          // jobs with the same non-empty key never share a batch
	req   T
	state jobState      // guarded by the queue's mu
	err   error         // set when the job was answered without being run
	done  chan struct{} // closed when answered
}

// batchQueue is the group commit of one kind of request: callers submit
// jobs, and the queue's workers (goroutines of the Store) take whatever is
// queued as one batch whenever they are free. There is no linger: an idle
// worker takes a lone job at once, and jobs that arrive while every worker is
// busy form the next batch. Jobs with the same key go out in arrival order,
// one per batch, and never in two batches at once.
type batchQueue[T any] struct {
	maxSize int

	mu      sync.Mutex
	cond    sync.Cond
	pending []*job[T]
	busy    map[string]struct{} // keys of the jobs being run
	closed  bool
}

func newBatchQueue[T any](maxSize int) *batchQueue[T] {
	q := &batchQueue[T]{maxSize: maxSize, busy: make(map[string]struct{})}
	q.cond.L = &q.mu
	return q
}

// submit queues a job, or returns errClosed once the queue is closed.
func (q *batchQueue[T]) submit(ctx context.Context, key string, req T) (*job[T], error) {
	j := &job[T]{ctx: ctx, key: key, req: req, done: make(chan struct{})}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, errClosed
	}
	q.pending = append(q.pending, j)
	q.cond.Signal()
	return j, nil
}

// wait waits until j is answered or the caller's ctx ends. It returns
// j.err, or nil with the result in j.req; or, when ctx ends first, the
// context's error and whether j had already been sent (its batch may still
// write it: the worker then settles it, see undo).
func (q *batchQueue[T]) wait(ctx context.Context, j *job[T]) (sent bool, err error) {
	select {
	case <-j.done:
		return true, j.err
	case <-ctx.Done():
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	switch j.state {
	case jobQueued:
		for i, p := range q.pending {
			if p == j {
				q.pending = append(q.pending[:i], q.pending[i+1:]...)
				break
			}
		}
		q.answerLocked(j, ctx.Err())
		return false, ctx.Err()
	case jobSent:
		j.state = jobAbandoned
		return true, ctx.Err()
	}
	return true, j.err // answered meanwhile
}

// answerLocked answers j without running it. q.mu is held.
func (q *batchQueue[T]) answerLocked(j *job[T], err error) {
	j.state, j.err = jobDone, err
	close(j.done)
}

// next blocks until it can take a batch, and returns it; nil once the queue
// is closed. Jobs whose callers are gone are answered and dropped; the rest
// join in arrival order, skipping (and so keeping in place) any whose key is
// already in this batch or in one being run.
func (q *batchQueue[T]) next() []*job[T] {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.closed {
			return nil
		}
		var batch []*job[T]
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
				j.state = jobSent
				batch = append(batch, j)
				continue
			}
			rest = append(rest, j)
		}
		clear(q.pending[len(rest):])
		q.pending = rest
		if len(batch) > 0 {
			for k := range keys {
				q.busy[k] = struct{}{}
			}
			return batch
		}
		q.cond.Wait()
	}
}

func (q *batchQueue[T]) keyTaken(keys map[string]struct{}, key string) bool {
	if key == "" {
		return false
	}
	_, inBatch := keys[key]
	_, running := q.busy[key]
	return inBatch || running
}

// finish answers every job of a batch that has run (results already in the
// jobs) and frees their keys. It returns the jobs whose callers gave up
// while the batch ran.
func (q *batchQueue[T]) finish(batch []*job[T]) (abandoned []*job[T]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range batch {
		if j.state == jobAbandoned {
			abandoned = append(abandoned, j)
		}
		if j.key != "" {
			delete(q.busy, j.key)
		}
		j.state = jobDone
		close(j.done)
	}
	q.cond.Broadcast() // freed keys may let queued jobs go
	return abandoned
}

// close answers every queued job with errClosed and makes next return nil.
// Batches being run finish.
func (q *batchQueue[T]) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for _, j := range q.pending {
		q.answerLocked(j, errClosed)
	}
	q.pending = nil
	q.cond.Broadcast()
}

// queued is the number of jobs waiting for a batch (tests).
func (q *batchQueue[T]) queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}
