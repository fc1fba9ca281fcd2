package client_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/testing/lockdtest"
)

// TestTargets: New takes a dns:/// name and a comma-separated list (C2
// #ct2-failover) and refuses a list entry that is not host:port.
func TestTargets(t *testing.T) {
	srv := lockdtest.StartBackend(t, backend.Etcd, lockdtest.Options{NoClient: true})
	_, port, _ := strings.Cut(srv.Addr, ":")
	for _, target := range []string{"dns:///localhost:" + port, "127.0.0.1:1, " + srv.Addr} {
		t.Run(target, func(t *testing.T) {
			c, err := client.New(target, client.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
			if err != nil {
				t.Fatalf("New(%q): %v", target, err)
			}
			defer c.Close()
			ctx := testCtx(t, 30*time.Second)
			s := newSession(t, ctx, c)
			if _, err := s.Acquire(ctx, "k"); err != nil {
				t.Fatalf("Acquire through %q: %v", target, err)
			}
		})
	}
	for _, target := range []string{"a:1,nonsense", "a:1,,b:2", "a:1,dns:///b:2"} {
		if _, err := client.New(target); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("New(%q) = %v; want ErrInvalidArgument", target, err)
		}
	}
}
