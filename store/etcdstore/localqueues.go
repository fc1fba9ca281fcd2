package etcdstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"lock.dev/lockd/store"
)

// localWaiter is an Acquire call of this Store waiting in a key's queue,
// with its waiter key's create revision.
type localWaiter struct {
	ss    *session
	rev   int64
	first bool // it has seen itself first in line; guarded by localQueues.mu
	// handed is the grant a release of this Store committed for it, told
	// from the release's commit result (C2 #ct2-release-handover); guarded
	// by localQueues.mu, set once.
	handed *handOff
	// wake ends the call's wait (its context) once handed is set.
	wake context.CancelCauseFunc
}

// handOff is a hand-over as the releasing commit made it: the grant key's
// revision (its token's) and the time written in the grant.
type handOff struct {
	rev int64
	at  time.Time
}

// errHandedOver ends a waiter's wait when a release of this Store handed
// it the key.
var errHandedOver = errors.New("etcdstore: handed over by a release of this store")

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

// handOver tells the local waiters of key that are the session id's call
// with waiter key create revision rev that a release's commit granted them
// the key (h), and ends their wait. It reports whether any was told. A
// waiter that already returned (it saw the watch event first) is no longer
// registered: nothing is told twice.
func (q *localQueues) handOver(key string, id store.SessionID, rev int64, h handOff) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	told := false
	for _, c := range q.byKey[key] {
		if c.ss.id == id && c.rev == rev && c.handed == nil && c.wake != nil {
			c.handed = &h
			c.wake(errHandedOver)
			told = true
		}
	}
	return told
}

// handedOff is the hand-over w was told of, if any.
func (q *localQueues) handedOff(w *localWaiter) (handOff, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.handed == nil {
		return handOff{}, false
	}
	return *w.handed, true
}
