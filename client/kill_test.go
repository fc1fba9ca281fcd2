package client_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// childEnv, when set to a lockd address, makes the test binary act as the
// client process of TestKilledClientLosesLocks (see TestMain).
const childEnv = "LOCKD_TEST_CHILD_ADDR"

// runChild takes the lock "killed" and reports "HELD <token>" on stdout,
// then holds it, heartbeating, until it is killed.
func runChild(addr string) int {
	c, err := client.New(addr)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := c.NewSession(ctx)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	l, err := s.Acquire(ctx, "killed")
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Printf("HELD %d\n", l.Token())
	<-ctx.Done() // the parent kills us long before
	return 1
}

// TestKilledClientLosesLocks: a client process killed with SIGKILL loses
// its locks within TTL + slack, and a waiter is granted the key.
func TestKilledClientLosesLocks(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		ctx := testCtx(t, 90*time.Second)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+srv.Addr)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start client process: %v", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HELD ") {
			t.Fatalf("client process said %q, %v; want HELD <token>", line, err)
		}
		var childToken uint64
		fmt.Sscanf(line, "HELD %d", &childToken)

		s := newSession(t, ctx, srv.Client)
		type result struct {
			l   *client.Lock
			err error
			at  time.Time
		}
		got := make(chan result, 1)
		go func() {
			l, err := s.Acquire(ctx, "killed")
			got <- result{l, err, time.Now()}
		}()
		testkit.Eventually(t, 10*time.Second, "waiter queued", func() bool {
			info, err := srv.Client.Inspect(ctx, "killed")
			return err == nil && len(info.Waiters) == 1
		})
		killedAt := time.Now()
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatalf("SIGKILL: %v", err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("waiter Acquire: %v", r.err)
		}
		took := r.at.Sub(killedAt)
		if slack := 5 * time.Second; took > lockdtest.TTL+slack {
			t.Errorf("waiter granted %v after the kill; want within TTL %v + %v", took, lockdtest.TTL, slack)
		}
		if r.l.Token() <= childToken {
			t.Errorf("waiter token %d; want > the killed client's %d", r.l.Token(), childToken)
		}
		t.Logf("waiter granted %v after SIGKILL", took.Round(time.Millisecond))
	})
}
