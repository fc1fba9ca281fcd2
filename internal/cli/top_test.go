package cli

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/creack/pty"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestTop drives lockd top in a pseudo-terminal: a key held before it
// started (the List seed), one acquired after (the watch), and a key waited
// for in the hot keys' contention ranking (the poll) appear on the screen;
// q quits with exit 0.
func TestTop(t *testing.T) {
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{})
	environ := []string{EnvServer + "=" + srv.Addr}
	hold(t, srv.Client, "t/before")
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatalf("pty.Open: %v", err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 60, Cols: 140}); err != nil {
		t.Fatal(err)
	}
	screen := &testkit.LogBuffer{}
	read := make(chan struct{})
	go func() { // ends when both sides are closed (EIO once the terminal side is)
		defer close(read)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			screen.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	defer func() { tty.Close(); <-read; ptmx.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stderr := &testkit.LogBuffer{}
	code := make(chan int, 1)
	go func() { // ends when top quits (q) or ctx ends
		code <- run(ctx, []string{"top", "--interval", "100ms", "t/"}, &env{stdin: tty, stdout: tty, stderr: stderr, environ: func() []string { return environ }})
	}()
	shows := func(what string, re *regexp.Regexp) {
		t.Helper()
		testkit.Eventually(t, 30*time.Second, what, func() bool { return re.MatchString(screen.String()) })
	}
	shows("the key held before top started", regexp.MustCompile(`t/before\s+\d+ `))
	hold(t, srv.Client, "t/after")
	shows("the key acquired while top runs", regexp.MustCompile(`t/after\s+\d+ `))
	// A hold of the template t/ ends: the waiter below gets an estimate.
	if err := hold(t, srv.Client, "t/ended").Release(ctx); err != nil {
		t.Fatal(err)
	}
	hold(t, srv.Client, "t/hot")
	s, err := srv.Client.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	wctx, wcancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() { _, err := s.Acquire(wctx, "t/hot"); waited <- err }() // ends at wcancel
	defer func() { wcancel(); <-waited }()
	shows("the key waited for, by contention", regexp.MustCompile(`t/hot\s+\d+ waiting acquires`))
	shows("its waiter with an estimate", regexp.MustCompile(`t/hot\s+1 waiting  next in ~\d+\.\ds, last in ~\d+\.\ds`))
	if _, err := ptmx.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("lockd top exited %d; stderr %s", c, stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("lockd top still running 20 s after q\nscreen:\n%s", screen)
	}
}
