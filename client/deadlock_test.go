package client_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestDeadlock: two sessions each holding the key the other waits for
// (C2 #ct2-deadlock). The wait that closes the cycle fails with
// ErrDeadlock naming both keys — once, not retried — and the other is
// granted once the refused session releases. With WithoutDeadlockCheck on
// the closing wait, the other (older) wait is refused instead — also when
// the closing wait is an AcquireAll's (C2 #ct2-acquire-all: the server used
// to drop the option beside keys, and the AcquireAll was refused).
func TestDeadlock(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, 60*time.Second)
		for _, tc := range []struct{ optOut, all bool }{{false, false}, {true, false}, {true, true}} {
			optOut := tc.optOut
			t.Run(fmt.Sprintf("optOut=%v/all=%v", optOut, tc.all), func(t *testing.T) {
				ka, kb := fmt.Sprintf("dl/%v/%v/a", optOut, tc.all), fmt.Sprintf("dl/%v/%v/b", optOut, tc.all)
				a, b := newSession(t, ctx, srv.Client), newSession(t, ctx, srv.Client)
				la, err := a.Acquire(ctx, ka)
				if err != nil {
					t.Fatal(err)
				}
				lb, err := b.Acquire(ctx, kb)
				if err != nil {
					t.Fatal(err)
				}
				type result struct {
					l   *client.Lock
					err error
				}
				aw, bw := make(chan result, 1), make(chan result, 1)
				go func() { l, err := a.Acquire(ctx, kb); aw <- result{l, err} }()
				testkit.Eventually(t, 10*time.Second, "a queued for b", func() error {
					info, err := srv.Client.Inspect(ctx, kb)
					if err != nil || len(info.Waiters) != 1 {
						return fmt.Errorf("waiters %v, %v", info.Waiters, err)
					}
					return nil
				})
				var opts []client.AcquireOption
				if optOut {
					opts = append(opts, client.WithoutDeadlockCheck())
				}
				go func() {
					if !tc.all {
						l, err := b.Acquire(ctx, ka, opts...)
						bw <- result{l, err}
						return
					}
					ls, err := b.AcquireAll(ctx, []string{ka}, opts...)
					if err != nil {
						bw <- result{nil, err}
						return
					}
					bw <- result{ls[0], nil}
				}()
				victim, other, keep, give := bw, aw, la, lb
				if optOut {
					victim, other, keep, give = aw, bw, lb, la
				}
				var r result
				select {
				case r = <-victim:
				case <-time.After(10 * time.Second):
					t.Fatal("no wait refused within 10 s")
				}
				var de *client.DeadlockError
				if !errors.Is(r.err, client.ErrDeadlock) || !errors.As(r.err, &de) || !slices.Equal(de.Keys, []string{ka, kb}) {
					t.Fatalf("victim: %v, %v; want a DeadlockError over [%s %s]", r.l, r.err, ka, kb)
				}
				select {
				case r := <-other:
					t.Fatalf("the other wait returned beside the victim: %v, %v", r.l, r.err)
				default:
				}
				if err := give.Release(ctx); err != nil {
					t.Fatal(err)
				}
				r = <-other
				if r.err != nil {
					t.Fatalf("the other wait after the victim released: %v", r.err)
				}
				for _, l := range []*client.Lock{r.l, keep} {
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	})
}
