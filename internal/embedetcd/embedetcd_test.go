package embedetcd_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) {
	testkit.Main(m, nil)
}

// put writes one key through a fresh client and returns the revision of the
// write.
func put(t *testing.T, s *embedetcd.Server) int64 {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New(%v): %v", s.Endpoints(), err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Put(ctx, "/k", "v")
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	return resp.Header.Revision
}

func TestRestartKeepsRevisions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	ctx := context.Background()
	cfg := embedetcd.Config{DataDir: dir, TickMs: 10, ElectionMs: 100}

	s, err := embedetcd.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	var last int64
	for range 3 {
		last = put(t, s)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatalf("stat data dir: %v", err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("data dir mode = %v, want 0700", perm)
	}

	s2, err := embedetcd.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start again on the same data dir: %v", err)
	}
	defer s2.Close()
	if got := put(t, s2); got <= last {
		t.Fatalf("revision after restart = %d, want > %d (revision before restart)", got, last)
	}
}

func TestRejectsNonLoopbackURL(t *testing.T) {
	for _, tc := range []struct{ name, client, peer string }{
		{"client on all interfaces", "http://0.0.0.0:23790", ""},
		{"peer on a public address", "", "http://192.0.2.1:23800"},
		{"https scheme", "https://127.0.0.1:23790", ""},
		{"no port", "http://127.0.0.1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := embedetcd.Start(context.Background(), embedetcd.Config{
				DataDir: t.TempDir(), ClientURL: tc.client, PeerURL: tc.peer})
			if err == nil {
				s.Close()
				t.Fatalf("Start(client=%q, peer=%q) succeeded, want an error", tc.client, tc.peer)
			}
		})
	}
}

func TestStartCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: t.TempDir()})
	if err == nil {
		s.Close()
		t.Fatal("Start with a cancelled context succeeded, want an error")
	}
}
