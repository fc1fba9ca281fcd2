package embedetcd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/embedetcd"
)

// TestBusyDataDirSaysWait: a second start on a data dir another live etcd
// serves is refused, and the error says what to do: wait for that process
// (a lockd still shutting down after a flood, issue 23) or use another
// --data-dir.
func TestBusyDataDirSaysWait(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: dir, Socket: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s2, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: dir, Socket: true})
	if err == nil {
		s2.Close()
		t.Fatal("a second Start on a served data dir succeeded")
	}
	if !strings.Contains(err.Error(), "another etcd serves this data dir") || !strings.Contains(err.Error(), "wait for that process to exit") {
		t.Errorf("second Start: %v; want it to say another etcd serves the dir and to wait for that process", err)
	}
}
