package client_test

import (
	"errors"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// TestAcquireAll: the SDK's AcquireAll, TryAcquireAll and ReleaseAll
// through a real server (C2 #ct2-acquire-all): Locks in the order asked,
// each trusted with its own token; a wait that times out and a refused try
// hold nothing; the one-key options are refused before anything is sent.
func TestAcquireAll(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, time.Minute)
		a := newSession(t, ctx, srv.Client)
		b := newSession(t, ctx, srv.Client)
		keys := []string{"sdkall/2", "sdkall/1"}
		ls, err := a.AcquireAll(ctx, keys)
		if err != nil || len(ls) != 2 {
			t.Fatalf("AcquireAll(%q) = %v, %v", keys, ls, err)
		}
		for i, l := range ls {
			if l.Key() != keys[i] || l.Token() == 0 || l.Err() != nil {
				t.Fatalf("lock %d = %q token %d err %v; want %q, trusted", i, l.Key(), l.Token(), l.Err(), keys[i])
			}
		}
		if again, err := a.TryAcquireAll(ctx, keys); err != nil || again[0] != ls[0] || again[1] != ls[1] {
			t.Fatalf("TryAcquireAll of held keys = %v, %v; want the same Locks", again, err)
		}
		if _, err := b.TryAcquireAll(ctx, []string{"sdkall/0", "sdkall/1"}); !errors.Is(err, client.ErrLocked) {
			t.Fatalf("b TryAcquireAll with sdkall/1 held = %v; want ErrLocked", err)
		}
		if _, err := b.AcquireAll(ctx, []string{"sdkall/0", "sdkall/1"}, client.WithWaitTimeout(200*time.Millisecond)); !errors.Is(err, client.ErrWaitTimeout) {
			t.Fatalf("b AcquireAll with a 200ms wait = %v; want ErrWaitTimeout", err)
		}
		if info, err := srv.Client.Inspect(ctx, "sdkall/0"); err != nil || info.Held {
			t.Fatalf("Inspect(sdkall/0) after b's failed calls = %+v, %v; want free", info, err)
		}
		for _, opt := range []client.AcquireOption{client.WithLimit(2), client.Shared(), client.WithValue([]byte("v")), client.WithMaxHold(time.Minute)} {
			if _, err := b.AcquireAll(ctx, []string{"sdkall/x"}, opt); !errors.Is(err, client.ErrInvalidArgument) {
				t.Fatalf("AcquireAll with a one-key option = %v; want ErrInvalidArgument", err)
			}
		}
		if _, err := b.AcquireAll(ctx, []string{"sdkall/x", "sdkall/x"}); !errors.Is(err, client.ErrInvalidArgument) {
			t.Fatalf("AcquireAll with a key twice = %v; want ErrInvalidArgument", err)
		}
		// b waits for the set; a's ReleaseAll hands it over.
		got := make(chan error, 1)
		go func() {
			ls, err := b.AcquireAll(ctx, []string{"sdkall/1", "sdkall/2"})
			if err == nil {
				err = client.ReleaseAll(ctx, ls)
			}
			got <- err
		}()
		if err := client.ReleaseAll(ctx, ls); err != nil {
			t.Fatalf("ReleaseAll: %v", err)
		}
		for _, l := range ls {
			if !errors.Is(l.Err(), client.ErrReleased) {
				t.Fatalf("%q after ReleaseAll: Err %v; want ErrReleased", l.Key(), l.Err())
			}
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("b AcquireAll after a's release: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("b AcquireAll not granted within 20s of a's ReleaseAll")
		}
	})
}
