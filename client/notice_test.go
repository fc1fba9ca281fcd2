package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// heartbeatWait bounds "by the next heartbeat answer" in these tests: one
// heartbeat interval (TTL/3), a reconnect, and slack for a loaded machine.
const heartbeatWait = lockdtest.TTL/3 + 2*time.Second

// TestLostNoticeRedelivered: the server's push of a lock-lost notice
// vanishes on the wire (written into a paused connection that is then
// cut). The notice stays pending on the server until acknowledged, so the
// holder learns of the revoke from the first answers on its new stream:
// Lock.Done closes while the session lives on (C2 #ct2-confirm).
func TestLostNoticeRedelivered(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		proxy := testkit.NewProxy(t, srv.Addr)
		c, err := client.New(proxy.Addr(), client.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ctx := testCtx(t, 60*time.Second)
		s := newSession(t, ctx, c)
		l, err := s.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		proxy.Pause()
		rv, err := srv.Client.Revoke(ctx, "k")
		if err != nil || rv.Token != l.Token() {
			proxy.Restore()
			t.Fatalf("Revoke = %+v, %v; want the holder's grant (token %d)", rv, err, l.Token())
		}
		proxy.Cut() // drops the notice the server wrote into the paused connection
		proxy.Restore()
		select {
		case <-l.Done():
		case <-time.After(heartbeatWait):
			t.Fatalf("Lock.Done not closed %v after a revoke whose notice was lost on the wire", heartbeatWait)
		}
		if !errors.Is(l.Err(), client.ErrLockLost) {
			t.Errorf("Lock.Err after the revoke = %v; want ErrLockLost", l.Err())
		}
		if closed(s.Done()) {
			t.Errorf("session ended (%v); want only the lock lost", s.Err())
		}
	})
}

// stripNotices is a client stream that removes every lock-lost notice from
// the KeepAlive replies it receives: the notices never arrive.
type stripNotices struct{ grpc.ClientStream }

func (s stripNotices) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*lockdv1.KeepAliveResponse); ok && err == nil {
		r.Lost = nil
		for _, a := range r.Batch {
			a.Lost = nil
		}
	}
	return err
}

// TestRevokeWithoutNoticeEndsTrust: no lock-lost notice ever reaches the
// holder. Its trust in the revoked lock still ends at the next heartbeat
// answer, which no longer lists the lock; the session and its other lock
// stay trusted and keep being extended.
func TestRevokeWithoutNoticeEndsTrust(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		strip := grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
			method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil || method != lockdv1.LockService_KeepAlive_FullMethodName {
				return cs, err
			}
			return stripNotices{cs}, nil
		})
		c := srv.NewClient(t, client.WithDialOptions(strip))
		ctx := testCtx(t, 60*time.Second)
		s := newSession(t, ctx, c)
		revoked, err := s.Acquire(ctx, "revoked")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		kept, err := s.Acquire(ctx, "kept")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if _, err := srv.Client.Revoke(ctx, "revoked"); err != nil {
			t.Fatalf("Revoke: %v", err)
		}
		select {
		case <-revoked.Done():
		case <-time.After(heartbeatWait):
			t.Fatalf("revoked lock still trusted %v after the revoke (no notice arrived)", heartbeatWait)
		}
		if !errors.Is(revoked.Err(), client.ErrLockLost) {
			t.Errorf("revoked lock: Err = %v; want ErrLockLost", revoked.Err())
		}
		after := time.Now()
		testkit.Eventually(t, 2*lockdtest.TTL, "session extended after the revoke", func() bool {
			return s.Deadline().After(after.Add(lockdtest.TTL / 2))
		})
		if closed(s.Done()) || closed(kept.Done()) {
			t.Errorf("session or the other lock ended: %v / %v", s.Err(), kept.Err())
		}
	})
}

// closeHook calls before with the session id of every CloseSession, before
// the store frees anything.
type closeHook struct {
	store.LockStore
	before func(store.SessionID)
}

func (h closeHook) CloseSession(ctx context.Context, id store.SessionID) (int, error) {
	h.before(id)
	return h.LockStore.CloseSession(ctx, id)
}

// TestShutdownWaitsForNotice: with close-sessions-on-shutdown the server
// frees a holder's lock only once the holder stopped trusting it: after it
// acknowledged the SERVER_SHUTDOWN notice (promptly, well before its
// deadline), or, when it cannot hear the server (paused connection), after
// its deadline passed (C5 #ct5-close-on-shutdown).
func TestShutdownWaitsForNotice(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		for _, paused := range []bool{false, true} {
			cfg := lockdtest.Config()
			cfg.CloseSessionsOnShutdown = true
			var (
				mu         sync.Mutex
				holder     *client.Lock
				holderID   string
				trusted    []bool // holder's lock still trusted when its session was closed
				closeCalls int
			)
			srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Config: &cfg, NoClient: true,
				Wrap: func(st store.LockStore) store.LockStore {
					return closeHook{LockStore: st, before: func(id store.SessionID) {
						mu.Lock()
						defer mu.Unlock()
						if holder != nil && string(id) == holderID {
							closeCalls++
							trusted = append(trusted, !closed(holder.Done()))
						}
					}}
				}})
			proxy := testkit.NewProxy(t, srv.Addr)
			c, err := client.New(proxy.Addr(), client.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			ctx := testCtx(t, 60*time.Second)
			s := newSession(t, ctx, c)
			l, err := s.Acquire(ctx, "k")
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			mu.Lock()
			holder, holderID = l, s.ID()
			mu.Unlock()
			if paused {
				proxy.Pause()
			}
			start := time.Now()
			if err := srv.Stop(); err != nil {
				t.Errorf("paused=%v: Stop: %v", paused, err)
			}
			took := time.Since(start)
			proxy.Restore()
			mu.Lock()
			if closeCalls == 0 {
				t.Errorf("paused=%v: the holder's session was never closed", paused)
			}
			for _, tr := range trusted {
				if tr {
					t.Errorf("paused=%v: session closed (lock freed) while its holder still trusted the lock", paused)
				}
			}
			mu.Unlock()
			if !paused && took > lockdtest.TTL-lockdtest.SafetyMargin {
				t.Errorf("shutdown took %v with a holder that acknowledges; want well before its deadline", took)
			}
			if !closed(l.Done()) || !errors.Is(l.Err(), client.ErrLockLost) && !paused {
				t.Errorf("paused=%v: after shutdown the lock is trusted or not lost: Err = %v", paused, l.Err())
			}
		}
	})
}
