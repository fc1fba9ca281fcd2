package lockdtest

import (
	"context"
	"sync"
	"time"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// Faulty wraps a real store for fault injection and observation: a test can
// make an operation fail with a chosen error, replace the Remaining the
// store reports with a fixed value, and read what was reported. Everything
// else goes to the real store. It is safe for concurrent use.
type Faulty struct {
	store.LockStore

	mu        sync.Mutex
	fail      map[string]*fault // by op (telemetry.Op*)
	remaining time.Duration     // > 0: reported instead of the store's Remaining
	reported  []time.Duration   // Remaining values reported, in order
	during    map[string]func() // by op: run inside its next call (During)
	expires   int               // ExpireSession calls (silence closes)
	answered  int               // ExpireSession calls the store answered
}

type fault struct {
	err   error
	after bool // call the store first, then return err
	once  bool
}

// NewFaulty wraps st.
func NewFaulty(st store.LockStore) *Faulty {
	return &Faulty{LockStore: st, fail: map[string]*fault{}}
}

// Fail makes every call of op (a telemetry.Op* name: open_session,
// heartbeat, close_session, try_insert, acquire, release, revoke, inspect,
// list, locks_of, watch) return err without reaching the store, until
// Fail(op, nil).
func (f *Faulty) Fail(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fail, op)
		return
	}
	f.fail[op] = &fault{err: err}
}

// FailOnce makes the next call of op return err: without reaching the
// store, or, with afterCall, after the store did the work (a reply lost on
// the way back).
func (f *Faulty) FailOnce(op string, err error, afterCall bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = &fault{err: err, after: afterCall, once: true}
}

// SetRemaining makes OpenSession, Heartbeat and grants report d as
// Remaining (0 restores the store's values).
func (f *Faulty) SetRemaining(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.remaining = d
}

// Reported returns the Remaining values reported so far (OpenSession,
// live heartbeats and grants), in order.
func (f *Faulty) Reported() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.reported...)
}

// During runs fn inside the next call of op (a telemetry.Op* name, as for
// Fail), before the call reaches the store or fails: the time a request
// spends at the server, e.g. to advance a test's clock meanwhile.
func (f *Faulty) During(op string, fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.during == nil {
		f.during = map[string]func(){}
	}
	f.during[op] = fn
}

// failure runs op's During hook, then returns the error to inject before
// calling the store for op, and the one to return after calling it.
func (f *Faulty) failure(op string) (before, after error) {
	f.mu.Lock()
	fn := f.during[op]
	delete(f.during, op)
	f.mu.Unlock()
	if fn != nil {
		fn()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ft := f.fail[op]
	if ft == nil {
		return nil, nil
	}
	if ft.once {
		delete(f.fail, op)
	}
	if ft.after {
		return nil, ft.err
	}
	return ft.err, nil
}

func (f *Faulty) report(rem time.Duration) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.remaining > 0 {
		rem = f.remaining
	}
	f.reported = append(f.reported, rem)
	return rem
}

// OpenSession implements store.SessionRegistry.
func (f *Faulty) OpenSession(ctx context.Context, ttl time.Duration, opts ...store.SessionOption) (store.Session, error) {
	before, after := f.failure(telemetry.OpOpenSession)
	if before != nil {
		return store.Session{}, before
	}
	s, err := f.LockStore.OpenSession(ctx, ttl, opts...)
	if err == nil {
		s.Remaining = f.report(s.Remaining)
	}
	return s, firstErr(err, after)
}

// Heartbeat implements store.SessionRegistry.
func (f *Faulty) Heartbeat(ctx context.Context, id store.SessionID) (store.Liveness, error) {
	before, after := f.failure(telemetry.OpHeartbeat)
	if before != nil {
		return store.Liveness{}, before
	}
	lv, err := f.LockStore.Heartbeat(ctx, id)
	if err == nil && after != nil {
		return store.Liveness{}, after
	}
	if err == nil && lv.Live {
		lv.Remaining = f.report(lv.Remaining)
	}
	return lv, err
}

// CloseSession implements store.SessionRegistry.
func (f *Faulty) CloseSession(ctx context.Context, id store.SessionID) (int, error) {
	before, after := f.failure(telemetry.OpCloseSession)
	if before != nil {
		return 0, before
	}
	n, err := f.LockStore.CloseSession(ctx, id)
	return n, firstErr(err, after)
}

// OpExpireSession names ExpireSession for During (no C4 op counts it).
const OpExpireSession = "expire_session"

// ExpireSession implements store.SessionRegistry: the call is counted
// (Expires), runs its During hook, and is passed on.
func (f *Faulty) ExpireSession(ctx context.Context, id store.SessionID) (store.Expiry, error) {
	f.mu.Lock()
	f.expires++
	f.mu.Unlock()
	f.failure(OpExpireSession)
	ex, err := f.LockStore.ExpireSession(ctx, id)
	f.mu.Lock()
	f.answered++
	f.mu.Unlock()
	return ex, err
}

// ExpiresAnswered returns how many ExpireSession calls of this server the
// store has answered (Expires counts them when they reach it).
func (f *Faulty) ExpiresAnswered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.answered
}

// Expires returns how many ExpireSession calls (silence closes of this
// server) reached the store.
func (f *Faulty) Expires() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.expires
}

// LocksOf implements store.SessionRegistry.
func (f *Faulty) LocksOf(ctx context.Context, id store.SessionID) ([]store.Grant, error) {
	before, after := f.failure(telemetry.OpLocksOf)
	if before != nil {
		return nil, before
	}
	gs, err := f.LockStore.LocksOf(ctx, id)
	return gs, firstErr(err, after)
}

// TryInsert implements store.LockStore.
func (f *Faulty) TryInsert(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (store.Grant, bool, error) {
	before, after := f.failure(telemetry.OpTryInsert)
	if before != nil {
		return store.Grant{}, false, before
	}
	g, ok, err := f.LockStore.TryInsert(ctx, id, key, opts...)
	if err == nil && after != nil {
		return store.Grant{}, false, after
	}
	if err == nil && ok {
		g.Remaining = f.report(g.Remaining)
	}
	return g, ok, err
}

// Acquire implements store.LockStore.
func (f *Faulty) Acquire(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (store.Grant, error) {
	before, after := f.failure(telemetry.OpAcquire)
	if before != nil {
		return store.Grant{}, before
	}
	g, err := f.LockStore.Acquire(ctx, id, key, opts...)
	if err == nil && after != nil {
		return store.Grant{}, after
	}
	if err == nil {
		g.Remaining = f.report(g.Remaining)
	}
	return g, err
}

// DeleteIfOwner implements store.LockStore.
func (f *Faulty) DeleteIfOwner(ctx context.Context, id store.SessionID, key string, token uint64) error {
	before, after := f.failure(telemetry.OpRelease)
	if before != nil {
		return before
	}
	return firstErr(f.LockStore.DeleteIfOwner(ctx, id, key, token), after)
}

// Revoke implements store.LockStore.
func (f *Faulty) Revoke(ctx context.Context, key string) (store.Grant, bool, error) {
	before, after := f.failure(telemetry.OpRevoke)
	if before != nil {
		return store.Grant{}, false, before
	}
	g, ok, err := f.LockStore.Revoke(ctx, key)
	if err == nil && after != nil {
		return store.Grant{}, false, after
	}
	return g, ok, err
}

// Inspect implements store.LockStore.
func (f *Faulty) Inspect(ctx context.Context, key string) (store.LockInfo, bool, error) {
	before, after := f.failure(telemetry.OpInspect)
	if before != nil {
		return store.LockInfo{}, false, before
	}
	info, ok, err := f.LockStore.Inspect(ctx, key)
	if err == nil && after != nil {
		return store.LockInfo{}, false, after
	}
	return info, ok, err
}

// List implements store.LockStore.
func (f *Faulty) List(ctx context.Context, prefix, after string, limit int) ([]store.LockInfo, error) {
	before, afterErr := f.failure(telemetry.OpList)
	if before != nil {
		return nil, before
	}
	infos, err := f.LockStore.List(ctx, prefix, after, limit)
	if err == nil && afterErr != nil {
		return nil, afterErr
	}
	return infos, err
}

// WatchFrom implements store.LockStore; it fails as op watch.
func (f *Faulty) WatchFrom(ctx context.Context, prefix, after string) (string, <-chan store.Event, error) {
	before, _ := f.failure(telemetry.OpWatch)
	if before != nil {
		return "", nil, before
	}
	return f.LockStore.WatchFrom(ctx, prefix, after)
}

func firstErr(err, after error) error {
	if err != nil {
		return err
	}
	return after
}

// AcquireAll implements store.LockStore over Faulty's own one-key calls,
// so their faults apply to every key of the call.
func (f *Faulty) AcquireAll(ctx context.Context, id store.SessionID, keys []string, wait bool, opts ...store.AcquireOption) ([]store.Grant, bool, error) {
	return store.AcquireAllInOrder(ctx, f, id, keys, wait, opts...)
}
