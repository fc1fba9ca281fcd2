package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// openPTY returns a pseudo-terminal's terminal side and a buffer collecting
// what is written to it; both are closed, and the reader stopped, at cleanup.
func openPTY(t *testing.T) (*os.File, *testkit.LogBuffer) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty %d: %v", n, err)
	}
	out := &testkit.LogBuffer{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // ends when the pty is closed
		defer wg.Done()
		buf := make([]byte, 4096)
		for {
			n, err := m.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		s.Close()
		m.Close()
		wg.Wait()
	})
	return s, out
}

// TestRunStatusOnTerminal: while waiting, lockd run keeps one status line up
// to date on a terminal (carriage return + erase line), and clears it.
func TestRunStatusOnTerminal(t *testing.T) {
	if isTerminal(&bytes.Buffer{}) {
		t.Fatal("isTerminal reports a buffer as a terminal")
	}
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{})
	l := hold(t, srv.Client, "tty")
	tty, out := openPTY(t)
	if !isTerminal(tty) {
		t.Fatal("isTerminal(pty) = false")
	}

	done := make(chan int, 1)
	e := &env{stdout: &testkit.LogBuffer{}, stderr: tty, environ: func() []string { return []string{EnvServer + "=" + srv.Addr} }}
	go func() { done <- run(context.Background(), []string{"run", "tty", "--", "true"}, e) }() // ends once granted
	testkit.Eventually(t, 30*time.Second, "two status updates", func() bool {
		return strings.Count(out.String(), "\r\x1b[Klockd run: waiting for \"tty\": held by token "+itoa(l.Token())) >= 2
	})
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("lockd run exited %d\n%q", code, out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("lockd run did not finish after the release")
	}
	testkit.Eventually(t, 5*time.Second, "the status line to be cleared", func() bool {
		return strings.HasSuffix(out.String(), "\r\x1b[K")
	})
	if strings.Contains(out.String(), "\n") {
		t.Errorf("terminal status wrote a newline: %q", out)
	}
}
