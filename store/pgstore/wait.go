package pgstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

const (
	// recheckInterval is how often a waiting Acquire re-checks its queue
	// without being woken: the safety net for a lost notification. Wake-ups
	// normally come from NOTIFY within one commit.
	recheckInterval = 3 * time.Second
)

// waiter is a local Acquire call waiting for its key.
type waiter struct {
	key     string
	session store.SessionID
	wake    chan struct{} // capacity 1: a pending wake-up is never lost
	// handed is the grant a release of this Store made to the session in
	// its commit, told from that commit's result (tellHandOver); guarded
	// by Store.mu, set once.
	handed *store.Grant
}

// addWaiter registers a waiter of session id for key, or returns
// errClosed.
func (s *Store) addWaiter(id store.SessionID, key string) (*waiter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	s.acquires.Add(1)
	w := &waiter{key: key, session: id, wake: make(chan struct{}, 1)}
	if s.waiters[key] == nil {
		s.waiters[key] = make(map[*waiter]struct{})
	}
	s.waiters[key][w] = struct{}{}
	return w, nil
}

func (s *Store) removeWaiter(w *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.waiters[w.key], w)
	if len(s.waiters[w.key]) == 0 {
		delete(s.waiters, w.key)
	}
	s.acquires.Done()
}

// wakeLocked wakes the local waiters of key: only those of session next
// (the key's first waiter, as the notification saw it) unless next is
// empty. s.mu is held.
//
// Waking only the first waiter spares the others an attempt each (with
// group commit, attempts for one key go one per batch, so a herd of them
// delays the one that matters). An empty next means the notifying
// transaction saw no waiter: every local waiter may then be one whose
// queue entry was not yet committed, so all are woken. A waiter can also
// become first after the notification was sent (its entry, with the
// smaller id, committed later); the attempt of whichever waiter was woken
// instead then finds the key free with another waiter first, and wakes
// that one (nudgeHead).
//
// For a semaphore or read/write key, next may name several sessions,
// space-separated, or none ("-"): the waiters the key's holders admit
// (migration 0008).
func (s *Store) wakeLocked(key string, next store.SessionID) {
	for w := range s.waiters[key] {
		if next != "" && !names(next, w.session) {
			continue
		}
		select {
		case w.wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// names reports whether next, one session id or several space-separated,
// names id.
func names(next, id store.SessionID) bool {
	if next == id {
		return true
	}
	for n := range strings.FieldsSeq(string(next)) {
		if store.SessionID(n) == id {
			return true
		}
	}
	return false
}

// wakeAllLocked wakes every local waiter. s.mu is held.
func (s *Store) wakeAllLocked() {
	for key := range s.waiters {
		s.wakeLocked(key, "")
	}
}

// Acquire implements store.LockStore. The waiter is registered locally
// before its first look at the queue, so a notification for any change
// committed after that look wakes it; between wake-ups it holds no
// connection. Each attempt is observed as a request of its own; the
// outcome (lockd_lock_acquire_total) once, for the call.
//
// With store.KeepPlace (C2 #ct2-keep-place) a call that ends without a grant
// leaves its waiters row in place, unless the session ended: the next
// call's enqueue finds it (ON CONFLICT DO NOTHING keeps its id, the place).
func (s *Store) Acquire(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (store.Grant, error) {
	keep := store.KeepsPlace(opts)
	if err := validateGrantArgs("acquire", id, key); err != nil {
		return store.Grant{}, s.acquireFailed(ctx, err)
	}
	o, err := store.NewAcquireOptions(opts...)
	if err != nil {
		return store.Grant{}, s.acquireFailed(ctx, fmt.Errorf("pgstore: acquire: %w", err))
	}
	if err := s.begin(ctx, "acquire"); err != nil {
		return store.Grant{}, s.acquireFailed(ctx, err)
	}
	if o.Multi() {
		return s.acquireMulti(ctx, id, key, o) // multi.go
	}
	w, err := s.addWaiter(id, key)
	if err != nil {
		return store.Grant{}, s.acquireFailed(ctx, err)
	}
	defer s.removeWaiter(w)
	g, wsp, err := s.acquireLoop(ctx, id, key, o, keep, w)
	wsp.EndWait(ctx, err) // the wait's span, if it waited traced (C4 #ct4-traces)
	return g, err
}

// acquireLoop is Acquire's attempts and waits, and the wait's span once an
// attempt found the key busy (nil when untraced): later attempts run under
// it. The span is returned, not ended in a deferred closure, so that an
// untraced call moves nothing to the heap.
func (s *Store) acquireLoop(ctx context.Context, id store.SessionID, key string, o store.AcquireOptions, keep bool, w *waiter) (store.Grant, *telemetry.Span, error) {
	var refused <-chan struct{} // closed when the detector refuses this wait
	var refusal func() *store.DeadlockError
	leave := func() {
		if !keep {
			s.leaveQueue(id, key)
		}
	}
	var waiting bool        // an attempt found the key busy
	var wsp *telemetry.Span // the wait's span from then; nil when untraced
	start := time.Now()
	recheck := time.NewTimer(s.recheck)
	defer recheck.Stop()
	for {
		r, err := s.attempt(ctx, id, key, keep, o.NoDeadlockCheck)
		if err != nil {
			leave()
			return store.Grant{}, wsp, s.acquireFailed(ctx, err)
		}
		if done, g, err := s.acquireDone(ctx, r.out, r.g, key, o, start, waiting); done {
			return g, wsp, err
		}
		if !waiting {
			waiting = true
			// The first busy attempt: the wait's span from now (C4
			// #ct4-traces); later attempts are its children.
			ctx, wsp = telemetry.StartWait(ctx, "pg")
		}
		if refused == nil && !o.NoDeadlockCheck {
			// Waiting from now: the detector may refuse it (registered
			// only now, so a grant at the first attempt costs nothing).
			dw := s.deadlocks.Register(id, key, nil)
			defer dw.Done()
			refused, refusal = dw.Refused(), dw.Err
		}
		wait := s.recheck
		if r.delay > 0 {
			// A lock-delay keeps the key: nothing notifies its end.
			wait = min(wait, r.delay+time.Millisecond)
		}
		recheck.Reset(wait)
		select {
		case <-w.wake:
			// Handed over by a release of this Store: its commit's grant is
			// the answer, unless ctx ended meanwhile (then the grant is one
			// no call returned, C2 #ct2-keep-place).
			if g, ok := s.takeHanded(w); ok && ctx.Err() == nil {
				s.newGrant(g, time.Since(start))
				return g, wsp, nil
			}
		case <-recheck.C:
		case <-refused:
			// The victim of a cycle (C2 #ct2-deadlock): the place goes,
			// also a kept one. A grant the last attempt got would have
			// been returned above.
			s.leaveQueue(id, key)
			return store.Grant{}, wsp, s.acquireFailed(ctx, fmt.Errorf("pgstore: acquire: %w", refusal()))
		case <-ctx.Done():
			leave()
			return store.Grant{}, wsp, s.acquireFailed(ctx, fmt.Errorf("pgstore: acquire: %w", ctx.Err()))
		case <-s.closing:
			leave()
			return store.Grant{}, wsp, s.acquireFailed(ctx, fmt.Errorf("pgstore: acquire: %w", errClosed))
		}
	}
}

// attempt is one attempt of Acquire: the grant, or a place in the key's
// queue. It is observed as one request.
func (s *Store) attempt(ctx context.Context, id store.SessionID, key string, keep, nodl bool) (_ *lockReq, err error) {
	defer s.metrics.Observe(telemetry.OpAcquire)(&err)
	return s.doLock(ctx, "acquire", &lockReq{op: opWait, id: id, key: key, keep: keep, nodl: nodl})
}

// leaveQueue removes the session's waiter row for key, best effort, with a
// context of its own: it runs because the caller's context ended. If it
// fails, the row stays until the session ends, and a later Acquire of the
// same session and key reuses it.
func (s *Store) leaveQueue(id store.SessionID, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = s.pool.Exec(ctx, s.q.dequeue, key, string(id))
}

// LeaveQueue implements store.LockStore: it deletes the session's waiters
// row for key, if any (C2 #ct2-keep-place); the waiters_deleted trigger
// wakes the next in line. It never touches a grant. It first settles the
// key's group commit: an attempt of a cut Acquire still in its batch (its
// caller gone, its enqueue not yet committed) would otherwise put the place
// back after this delete, and keep it until the session ends.
func (s *Store) LeaveQueue(ctx context.Context, id store.SessionID, key string) (err error) {
	if err := validateGrantArgs("leave queue", id, key); err != nil {
		return err
	}
	if err := s.begin(ctx, "leave queue"); err != nil {
		return err
	}
	defer s.metrics.Observe(telemetry.OpLeaveQueue)(&err)
	if err := s.lockQ.Settle(ctx, key); err != nil {
		return classify(ctx, "leave queue", err)
	}
	if _, err := s.pool.Exec(ctx, s.q.dequeue, key, string(id)); err != nil {
		return classify(ctx, "leave queue", err)
	}
	return nil
}

// acquireDone ends a waiting Acquire on an attempt's outcome: a grant (new
// or already held), a dead session or a mismatch ends it (done), anything
// else (busy) has it wait on. start is when the Acquire began; waited, that
// an earlier attempt of the call found the key busy: a key it then finds
// held was handed to it by a release (C2 #ct2-release-handover), a new
// grant of this call.
func (s *Store) acquireDone(ctx context.Context, out outcome, g store.Grant, key string, o store.AcquireOptions, start time.Time, waited bool) (bool, store.Grant, error) {
	switch out {
	case granted:
		s.newGrant(g, time.Since(start))
		return true, g, nil
	case held:
		if waited {
			s.newGrant(g, time.Since(start))
			return true, g, nil
		}
		s.metrics.Acquire(telemetry.AcquireGranted, 0)
		return true, g, nil
	case dead:
		return true, store.Grant{}, s.acquireFailed(ctx, fmt.Errorf("pgstore: acquire: %w", store.ErrSessionDead))
	case mismatch:
		return true, store.Grant{}, s.acquireFailed(ctx, fmt.Errorf("pgstore: acquire: %w", errMismatch(key, o)))
	}
	return false, store.Grant{}, nil
}
