package etcdstore

import (
	"slices"
	"sync"
)

// localWaiter is an Acquire call of this Store waiting in a key's queue,
// with its waiter key's create revision.
type localWaiter struct {
	ss    *session
	rev   int64
	first bool // it has seen itself first in line; guarded by localQueues.mu
}

// localQueues are the Acquire calls of this Store waiting in keys' queues,
// per lockd key: a release guesses the first in line from them (see
// DeleteIfOwner). Its lock nests nothing.
type localQueues struct {
	mu    sync.Mutex
	byKey map[string][]*localWaiter
}

// add registers w as waiting for key until the returned function is
// called.
func (q *localQueues) add(key string, w *localWaiter) func() {
	q.mu.Lock()
	q.byKey[key] = append(q.byKey[key], w)
	q.mu.Unlock()
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		ws := q.byKey[key]
		if i := slices.Index(ws, w); i >= 0 {
			ws = slices.Delete(ws, i, i+1)
		}
		if len(ws) == 0 {
			delete(q.byKey, key)
		} else {
			q.byKey[key] = ws
		}
	}
}

// setFirst records that w has seen itself first in line.
func (q *localQueues) setFirst(w *localWaiter) {
	q.mu.Lock()
	w.first = true
	q.mu.Unlock()
}

// first is the guess for the first in key's queue: a live local waiter
// that has seen itself first in line (it stays first until it is granted
// the key or leaves). ok is false when this Store has none.
func (q *localQueues) first(key string) (w localWaiter, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range q.byKey[key] {
		if c.first && !c.ss.isDone() && (!ok || c.rev < w.rev) {
			w, ok = *c, true
		}
	}
	return w, ok
}
