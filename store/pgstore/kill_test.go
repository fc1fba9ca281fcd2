package pgstore

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// envChild, when set (to a DSN), makes the test binary act as the child
// process of TestKilledProcessLocksAreReaped instead of running tests.
const envChild = "LOCKD_PGSTORE_TEST_CHILD"

const (
	childSessions = 2
	childKeys     = 2 // per session
	// childHeartbeat is how often the child heartbeats its sessions, as
	// lockd does on behalf of its clients.
	childHeartbeat = 200 * time.Millisecond
)

// runChild opens sessions, takes locks, prints READY and heartbeats until it
// is killed. Its exit code reports a failure before that.
func runChild() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "child: "+format+"\n", args...)
		return 3
	}
	ctx := context.Background()
	s, err := New(ctx, Options{DSN: os.Getenv(envChild)})
	if err != nil {
		return fail("New: %v", err)
	}
	var ids []store.SessionID
	for i := range childSessions {
		sess, err := s.OpenSession(ctx, ttl)
		if err != nil {
			return fail("OpenSession: %v", err)
		}
		ids = append(ids, sess.ID)
		for j := range childKeys {
			if _, ok, err := s.TryInsert(ctx, sess.ID, fmt.Sprintf("kill/%d/%d", i, j)); err != nil || !ok {
				return fail("TryInsert: %v, %v", ok, err)
			}
		}
	}
	fmt.Println("READY")
	for {
		time.Sleep(childHeartbeat) // a heartbeat schedule, as lockd's
		for _, id := range ids {
			if l, err := s.Heartbeat(ctx, id); err != nil || !l.Live {
				return fail("Heartbeat: %+v, %v", l, err)
			}
		}
	}
}

// TestKilledProcessLocksAreReaped runs a separate process that holds locks
// in PostgreSQL sessions and SIGKILLs it: nobody heartbeats the sessions any
// more, and the reaper (here, in the test process) frees the locks within
// TTL + reaper interval (+ slack) of the kill, but not before the sessions'
// expires_at, which the child's last heartbeat set.
func TestKilledProcessLocksAreReaped(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s := newStore(t, dsn)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+dsn)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	waited := make(chan error, 1)
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			<-waited
		}
	})
	ready := make(chan bool, 1)
	// This goroutine ends when the child's stdout closes, i.e. when it dies.
	go func() {
		sc := bufio.NewScanner(out)
		ok := sc.Scan() && strings.TrimSpace(sc.Text()) == "READY"
		ready <- ok
		for sc.Scan() {
		}
		waited <- cmd.Wait()
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("child did not report READY")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("child not ready within 60s")
	}

	if l, err := s.List(testCtx(t), "kill/", "", 0); err != nil || len(l) != childSessions*childKeys {
		t.Fatalf("child holds %d locks (List err %v), want %d", len(l), err, childSessions*childKeys)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatalf("kill child: %v", err)
	}
	killedAt := time.Now()
	killed = true
	<-waited

	// The child is dead, so its sessions' expires_at (database clock) are
	// final: no lock may be freed before them.
	var expiresAt *time.Time
	if err := s.pool.QueryRow(testCtx(t), "SELECT max(expires_at) FROM "+s.schemaIdent()+".sessions").Scan(&expiresAt); err != nil {
		t.Fatalf("read expires_at: %v", err)
	}
	if expiresAt == nil {
		t.Fatal("the child's sessions were gone right after the kill: it had not heartbeated them for a TTL")
	}
	// freeAt is the database's clock when a poll first saw the locks gone;
	// clock_timestamp() is read after the statement's snapshot, so after the
	// reaper's commit.
	var freeAt time.Time
	bound := ttl + testReaperInterval + 2*time.Second
	testkit.Eventually(t, bound, "locks of the killed process reaped", func() error {
		var n int
		if err := s.pool.QueryRow(testCtx(t), "SELECT count(*), clock_timestamp() FROM "+s.schemaIdent()+
			".locks WHERE key LIKE 'kill/%'").Scan(&n, &freeAt); err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("%d locks still held", n)
		}
		return nil
	})
	took := time.Since(killedAt)
	if freeAt.Before(*expiresAt) {
		t.Fatalf("locks freed by %v, before the sessions' expires_at %v", freeAt, *expiresAt)
	}
	if n := count(t, s, "sessions"); n != 0 {
		t.Fatalf("%d session rows left after the reap, want 0", n)
	}
	t.Logf("locks of the killed process freed %v after SIGKILL (TTL %v, reaper interval %v)", took, ttl, testReaperInterval)
}
