package client_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestCheckToken: client.CheckToken on both backends (C2
// #ct2-check-token): the holder's token is current in both modes, stale
// after the lock passes to another session, a key nobody holds is not
// current, and token 0 is refused before anything is sent.
func TestCheckToken(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, time.Minute)
		c := srv.Client
		a := newSession(t, ctx, c)
		l1, err := a.Acquire(ctx, "check/k")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		for _, opts := range []client.CheckOptions{{}, {Cached: true}} {
			got, err := c.CheckToken(ctx, "check/k", l1.Token(), opts)
			if err != nil || !got.Current || !slices.Equal(got.Tokens, []uint64{l1.Token()}) {
				t.Fatalf("CheckToken(holder's token, %+v) = %+v, %v; want current", opts, got, err)
			}
		}
		if err := l1.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		b := newSession(t, ctx, c)
		l2, err := b.Acquire(ctx, "check/k")
		if err != nil {
			t.Fatalf("re-Acquire: %v", err)
		}
		got, err := c.CheckToken(ctx, "check/k", l1.Token(), client.CheckOptions{})
		if err != nil || got.Current || got.Cached || !slices.Equal(got.Tokens, []uint64{l2.Token()}) {
			t.Fatalf("CheckToken(old token) after a re-grant = %+v, %v; want stale, tokens [%d]", got, err, l2.Token())
		}
		testkit.Eventually(t, 10*time.Second, "the cached check sees the re-grant", func() bool {
			got, err := c.CheckToken(ctx, "check/k", l1.Token(), client.CheckOptions{Cached: true})
			return err == nil && !got.Current
		})
		got, err = c.CheckToken(ctx, "check/unknown", 7, client.CheckOptions{})
		if err != nil || got.Current || len(got.Tokens) != 0 {
			t.Fatalf("CheckToken(unknown key) = %+v, %v; want not current", got, err)
		}
		if _, err := c.CheckToken(ctx, "check/k", 0, client.CheckOptions{}); !errors.Is(err, client.ErrInvalidArgument) {
			t.Fatalf("CheckToken(token 0) = %v; want ErrInvalidArgument", err)
		}
	})
}

// TestCheckTokenDenied: a caller without read on the key is refused
// (ErrPermissionDenied), like Inspect; one with read is answered. Both
// backends.
func TestCheckTokenDenied(t *testing.T) {
	forBackends(t, checkTokenDenied)
}

func checkTokenDenied(t *testing.T, backend string) {
	dir := t.TempDir()
	az, err := auth.New(auth.Config{
		PolicyFile: writeFile(t, dir, "policy.yaml", `
rules:
  - name: alice
    principals: [alice]
    prefixes: ["mine/"]
    allow: [read]
`),
		TokensFile: writeFile(t, dir, "tokens", auth.HashToken("token-of-alice-0123456789")+" alice\n"),
	}, auth.Options{})
	if err != nil {
		t.Fatalf("auth.New: %v", err)
	}
	t.Cleanup(func() { _ = az.Close() })
	srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Auth: az, NoClient: true})
	ctx := testCtx(t, time.Minute)
	alice := srv.NewClient(t, client.WithBearerToken("token-of-alice-0123456789"))
	anon := srv.NewClient(t)
	if _, err := alice.CheckToken(ctx, "mine/k", 1, client.CheckOptions{}); err != nil {
		t.Errorf("CheckToken(mine/k) with read: %v", err)
	}
	for name, call := range map[string]func() error{
		"alice on another prefix": func() error {
			_, err := alice.CheckToken(ctx, "theirs/k", 1, client.CheckOptions{})
			return err
		},
		"anonymous": func() error {
			_, err := anon.CheckToken(ctx, "mine/k", 1, client.CheckOptions{Cached: true})
			return err
		},
	} {
		if err := call(); !errors.Is(err, client.ErrPermissionDenied) {
			t.Errorf("CheckToken %s = %v; want ErrPermissionDenied", name, err)
		}
	}
}
