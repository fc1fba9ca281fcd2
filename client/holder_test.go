package client_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// TestHolderIdentity: issue #15 §1 in the SDK. The owner, labels and value
// of a holder come back from Inspect and List of another client, and a
// TryAcquire that finds the key held names the holder in its ErrLocked.
func TestHolderIdentity(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, time.Minute)
		labels := map[string]string{"job": "deploy/api"}
		holder := newSession(t, ctx, srv.Client, client.WithOwner("web-3 (pid 812)", labels))
		l, err := holder.TryAcquire(ctx, "holder/a", client.WithValue([]byte("v1")))
		if err != nil {
			t.Fatalf("TryAcquire(WithValue): %v", err)
		}
		other := srv.NewClient(t)
		info, err := other.Inspect(ctx, "holder/a")
		if err != nil || info.Owner != "web-3 (pid 812)" || !maps.Equal(info.Labels, labels) || !bytes.Equal(info.Value, []byte("v1")) {
			t.Fatalf("Inspect = %+v, %v; want owner, labels and value", info, err)
		}
		if got, want := info.Holder(), fmt.Sprintf("web-3 (pid 812) token %d", l.Token()); got != want {
			t.Errorf("Holder() = %q, want %q", got, want)
		}
		page, _, err := other.List(ctx, "holder/", client.ListOptions{})
		if err != nil || len(page) != 1 || page[0].Owner != "web-3 (pid 812)" || !bytes.Equal(page[0].Value, []byte("v1")) {
			t.Fatalf("List = %+v, %v", page, err)
		}

		s2 := newSession(t, ctx, other)
		_, err = s2.TryAcquire(ctx, "holder/a")
		if want := fmt.Sprintf("held by web-3 (pid 812) token %d", l.Token()); !errors.Is(err, client.ErrLocked) || !strings.Contains(err.Error(), want) {
			t.Errorf("TryAcquire(held) = %v; want ErrLocked naming %q", err, want)
		}

		// Bounds are checked before anything is sent.
		if _, err := other.NewSession(ctx, client.WithOwner(strings.Repeat("o", 129), nil)); !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "owner") {
			t.Errorf("NewSession(long owner) = %v; want ErrInvalidArgument about owner", err)
		}
		if _, err := other.NewSession(ctx, client.WithOwner("", map[string]string{"k\n": "v"})); !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "labels") {
			t.Errorf("NewSession(bad label) = %v; want ErrInvalidArgument about labels", err)
		}
		if _, err := s2.TryAcquire(ctx, "holder/b", client.WithValue(make([]byte, 4097))); !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "value") {
			t.Errorf("TryAcquire(long value) = %v; want ErrInvalidArgument about value", err)
		}
	})
}
