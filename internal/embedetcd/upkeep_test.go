package embedetcd_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/testkit"
)

func client(t *testing.T, s *embedetcd.Server) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New(%v): %v", s.Endpoints(), err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func start(t *testing.T, cfg embedetcd.Config) *embedetcd.Server {
	t.Helper()
	cfg.DataDir = t.TempDir()
	cfg.TickMs, cfg.ElectionMs = 10, 100
	s, err := embedetcd.Start(testkit.Context(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// logged counts the records of a C4 event (the message is the event name).
func logged(logs *testkit.LogBuffer, event string) int {
	n := 0
	for _, rec := range logs.Records() {
		if rec["msg"] == event {
			n++
		}
	}
	return n
}

// TestCompactsByRevisionCount: the history is compacted to the current
// revision minus CompactionRetainRevisions, not only hourly.
func TestCompactsByRevisionCount(t *testing.T) {
	logger, logs := testkit.NewLogger()
	s := start(t, embedetcd.Config{Logger: logger, CompactionRetainRevisions: 50, CompactionInterval: 50 * time.Millisecond})
	cli := client(t, s)
	ctx := testkit.Context(t, 30*time.Second)
	first, err := cli.Put(ctx, "/k", "v")
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	for i := range 200 {
		if _, err := cli.Put(ctx, "/k", fmt.Sprint(i)); err != nil {
			t.Fatalf("Put #%d: %v", i, err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the first revision compacted", func() error {
		_, err := cli.Get(ctx, "/k", clientv3.WithRev(first.Header.Revision))
		if !errors.Is(rpctypes.Error(err), rpctypes.ErrCompacted) {
			return fmt.Errorf("Get at revision %d: %v, want ErrCompacted", first.Header.Revision, err)
		}
		return nil
	})
	resp, err := cli.Get(ctx, "/k")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if _, err := cli.Get(ctx, "/k", clientv3.WithRev(resp.Header.Revision-40)); err != nil {
		t.Fatalf("Get 40 revisions back (retained): %v", err)
	}
	if logged(logs, "backend_compacted") == 0 {
		t.Fatalf("no backend_compacted event logged; logs:\n%s", logs)
	}
}

// TestRecoversFromNoSpace: with a small quota, writes raise etcd's NOSPACE
// alarm; the server compacts, defragments and disarms it by itself, logs
// it, and writes succeed again.
func TestRecoversFromNoSpace(t *testing.T) {
	logger, logs := testkit.NewLogger()
	const quota = 16 << 20
	// No periodic check: the alarm alone must bring the space back.
	s := start(t, embedetcd.Config{Logger: logger, QuotaBytes: quota, CompactionInterval: time.Hour})
	cli := client(t, s)
	ctx := testkit.Context(t, time.Minute)
	value := strings.Repeat("x", 512<<10)
	noSpace := 0
	for i := 0; noSpace == 0 && i < 200; i++ {
		_, err := cli.Put(ctx, "/big", value)
		switch {
		case errors.Is(rpctypes.Error(err), rpctypes.ErrNoSpace):
			noSpace++
		case err != nil:
			t.Fatalf("Put #%d: %v", i, err)
		}
	}
	if noSpace == 0 {
		t.Fatalf("200 puts of 512 KiB never hit the %d-byte quota", quota)
	}
	testkit.Eventually(t, 30*time.Second, "alarm disarmed and writes accepted again", func() error {
		if _, err := cli.Put(ctx, "/small", "v"); err != nil {
			return err
		}
		resp, err := cli.AlarmList(ctx)
		if err != nil || len(resp.Alarms) != 0 {
			return fmt.Errorf("alarms %v, %v", resp, err)
		}
		return nil
	})
	if logged(logs, "backend_space_exhausted") == 0 || logged(logs, "backend_space_recovered") == 0 {
		t.Fatalf("want backend_space_exhausted and backend_space_recovered logged; logs:\n%s", logs)
	}
	st, err := cli.Status(ctx, s.Endpoints()[0])
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if st.DbSize >= quota {
		t.Fatalf("db size %d after recovery, want below the quota %d", st.DbSize, quota)
	}
}
