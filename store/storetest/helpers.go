package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

type suite struct {
	cfg Config
}

// namespaces remembers each subtest's open function, so that reopen can add
// an instance to the namespace the subtest already uses.
var namespaces sync.Map // *testing.T -> func(*testing.T) store.LockStore

// expiryBound is how long the suite waits for a dead session's locks to go.
func (s *suite) expiryBound() time.Duration { return TTL + s.cfg.ExpirySlack + margin }

// instances opens n independent store instances over one fresh namespace.
func (s *suite) instances(t *testing.T, n int) []store.LockStore {
	t.Helper()
	open := s.cfg.Namespace(t)
	namespaces.Store(t, open)
	t.Cleanup(func() { namespaces.Delete(t) })
	out := make([]store.LockStore, n)
	for i := range out {
		out[i] = openInstance(t, open)
	}
	return out
}

// reopen opens one more instance over the namespace of the subtest's earlier
// instances call.
func (s *suite) reopen(t *testing.T) store.LockStore {
	t.Helper()
	open, ok := namespaces.Load(t)
	if !ok {
		t.Fatal("storetest: reopen before instances")
	}
	return openInstance(t, open.(func(*testing.T) store.LockStore))
}

func openInstance(t *testing.T, open func(*testing.T) store.LockStore) store.LockStore {
	st := open(t)
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("Close store instance: %v", err)
		}
	})
	return st
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openSession opens a session with LongTTL.
func openSession(t *testing.T, st store.LockStore) store.SessionID {
	t.Helper()
	return openSessionTTL(t, st, LongTTL)
}

func openSessionTTL(t *testing.T, st store.LockStore, ttl time.Duration) store.SessionID {
	t.Helper()
	sess, err := st.OpenSession(ctxT(t), ttl)
	if err != nil {
		t.Fatalf("OpenSession(%v): %v", ttl, err)
	}
	if len(sess.ID) < 22 {
		t.Fatalf("OpenSession: id %q is too short to carry 128 random bits", sess.ID)
	}
	if sess.TTL < ttl || sess.TTL >= ttl+time.Second {
		t.Fatalf("OpenSession: TTL %v, want the requested %v, rounded up by less than a second at most", sess.TTL, ttl)
	}
	if sess.Remaining <= 0 || sess.Remaining > sess.TTL {
		t.Fatalf("OpenSession: Remaining %v, want in (0, TTL %v]", sess.Remaining, sess.TTL)
	}
	return sess.ID
}

func mustTry(t *testing.T, st store.LockStore, id store.SessionID, key string) store.Grant {
	t.Helper()
	g, ok, err := st.TryInsert(ctxT(t), id, key)
	if err != nil || !ok {
		t.Fatalf("TryInsert(%q) = acquired %v, err %v; want a grant", key, ok, err)
	}
	if g.Key != key || g.Session != id || g.Token == 0 {
		t.Fatalf("TryInsert(%q) = %+v; want key %q, session %q, non-zero token", key, g, key, id)
	}
	return g
}

func mustRelease(t *testing.T, st store.LockStore, g store.Grant) {
	t.Helper()
	if err := st.DeleteIfOwner(ctxT(t), g.Session, g.Key, g.Token); err != nil {
		t.Fatalf("DeleteIfOwner(%q, token %d): %v", g.Key, g.Token, err)
	}
}

func inspect(t *testing.T, st store.LockStore, key string) (store.LockInfo, bool) {
	t.Helper()
	info, found, err := st.Inspect(ctxT(t), key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return info, found
}

func heartbeat(t *testing.T, st store.LockStore, id store.SessionID) store.Liveness {
	t.Helper()
	l, err := st.Heartbeat(ctxT(t), id)
	if err != nil {
		t.Fatalf("Heartbeat(%q): %v", id, err)
	}
	return l
}

// waitersAre polls until key's waiter list equals want.
func waitersAre(t *testing.T, st store.LockStore, key string, want []store.SessionID) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("waiters of %q", key), func() error {
		info, _, err := st.Inspect(ctxT(t), key)
		if err != nil {
			return err
		}
		if !slices.Equal(info.Waiters, want) {
			return fmt.Errorf("waiters %v, want %v", info.Waiters, want)
		}
		return nil
	})
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want errors.Is(err, %v)", what, err, target)
	}
}

type acquireResult struct {
	g   store.Grant
	err error
}

// startAcquire runs Acquire in a goroutine owned by the test.
func startAcquire(t *testing.T, ctx context.Context, st store.LockStore, id store.SessionID, key string, opts ...store.AcquireOption) <-chan acquireResult {
	ch := make(chan acquireResult, 1)
	go func() {
		g, err := st.Acquire(ctx, id, key, opts...)
		ch <- acquireResult{g, err}
	}()
	return ch
}

func recvResult(t *testing.T, ch <-chan acquireResult, within time.Duration, what string) acquireResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		t.Fatalf("%s: Acquire did not return within %v", what, within)
		return acquireResult{}
	}
}

func notReturned(t *testing.T, ch <-chan acquireResult, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: Acquire returned early: %+v, %v", what, r.g, r.err)
	default:
	}
}
