package etcdstore

import (
	"context"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/storetest"
)

// fullTTL is a store that breaks C2 #ct2-deadline on purpose: every
// OpenSession, Heartbeat and grant reports the session's full TTL as
// Remaining, whenever the backend last extended the session.
type fullTTL struct {
	store.LockStore
	ttl map[store.SessionID]store.Session // only the test's goroutine uses it
}

func (f *fullTTL) OpenSession(ctx context.Context, ttl time.Duration, opts ...store.SessionOption) (store.Session, error) {
	s, err := f.LockStore.OpenSession(ctx, ttl, opts...)
	s.Remaining = s.TTL
	f.ttl[s.ID] = s
	return s, err
}

func (f *fullTTL) Heartbeat(ctx context.Context, id store.SessionID) (store.Liveness, error) {
	lv, err := f.LockStore.Heartbeat(ctx, id)
	lv.Remaining = f.ttl[id].TTL
	return lv, err
}

func (f *fullTTL) TryInsert(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (store.Grant, bool, error) {
	g, ok, err := f.LockStore.TryInsert(ctx, id, key, opts...)
	g.Remaining = f.ttl[id].TTL
	return g, ok, err
}

func (f *fullTTL) Acquire(ctx context.Context, id store.SessionID, key string, opts ...store.AcquireOption) (store.Grant, error) {
	g, err := f.LockStore.Acquire(ctx, id, key, opts...)
	g.Remaining = f.ttl[id].TTL
	return g, err
}

// TestRemainingCheckControl: the conformance subtest RemainingCountsDown
// (storetest.CheckRemaining) passes on the store and fails on the same store
// wrapped to answer the full TTL every time, so it can see that mistake.
func TestRemainingCheckControl(t *testing.T) {
	t.Parallel()
	st := newStore(t, etcdtest.NewClient(t), etcdtest.Prefix(t), nil)
	if err := storetest.CheckRemaining(t, st); err != nil {
		t.Fatalf("CheckRemaining on the store itself: %v", err)
	}
	err := storetest.CheckRemaining(t, &fullTTL{LockStore: st, ttl: map[store.SessionID]store.Session{}})
	if err == nil {
		t.Fatal("CheckRemaining passed a store that answers the full TTL every time; want a failure")
	}
	t.Logf("control caught: %v", err)
}
