package etcdstore

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/etcdtest"
)

// TestTokensAboveAnOlderDataDir: an exclusive Store (lockd's embedded etcd)
// restarted on an older copy of its data dir — whose epoch and revisions are
// both old — still hands out tokens above every token issued since the copy
// was taken (C2 #ct2-fencing). A non-exclusive Store on the same copy would
// go back; that is what the operator steps for a shared etcd are for.
func TestTokensAboveAnOlderDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	older := filepath.Join(t.TempDir(), "older")
	grants := func(dir string, exclusive bool, n int) (last uint64) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		srv, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: dir, TickMs: etcdtest.TickMs, ElectionMs: etcdtest.ElectionMs})
		if err != nil {
			t.Fatalf("embedetcd.Start(%s): %v", dir, err)
		}
		defer srv.Close()
		cli := etcdtest.NewClient(t, srv.Endpoints()...)
		defer cli.Close()
		st, err := New(ctx, cli, Options{Prefix: DefaultPrefix, Exclusive: exclusive})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		defer st.Close()
		id := openSession(t, st, time.Minute)
		for i := range n {
			g, ok, err := st.TryInsert(ctxT(t), id, "k")
			if err != nil || !ok {
				t.Fatalf("TryInsert #%d = %v, %v", i, ok, err)
			}
			if err := st.DeleteIfOwner(ctxT(t), id, "k", g.Token); err != nil {
				t.Fatalf("DeleteIfOwner #%d: %v", i, err)
			}
			last = g.Token
		}
		return last
	}
	grants(dir, true, 3)
	// The older copy, taken while lockd is stopped.
	if out, err := exec.Command("cp", "-a", dir, older).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v\n%s", err, out)
	}
	high := grants(dir, true, 50) // tokens issued after the copy
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if got := grants(older, true, 1); got <= high {
		t.Fatalf("first token on the older copy = %d; want above %d, the last token issued before the restore", got, high)
	}
}
