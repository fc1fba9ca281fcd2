package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// forBackends runs f against a fresh lockd server on every test backend.
func forBackends(t *testing.T, f func(t *testing.T, srv *lockdtest.Server, environ []string)) {
	for _, backend := range lockdtest.Backends {
		t.Run(backend, func(t *testing.T) {
			srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
			f(t, srv, []string{EnvServer + "=" + srv.Addr, "PATH=" + os.Getenv("PATH")})
		})
	}
}

// hold takes key through the SDK and returns the lock; released at cleanup.
func hold(t *testing.T, c *client.Client, key string) *client.Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	l, err := s.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return l
}

func TestRunExitCodeAndEnv(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		res := lockd(t, append(environ, "LOCKD_KEY=stale", "LOCKD_FENCING_TOKEN=0"),
			"run", "jobs/a", "--", "sh", "-c", `echo "key=$LOCKD_KEY token=$LOCKD_FENCING_TOKEN"; exit 7`)
		if res.code != 7 {
			t.Fatalf("exit code %d, want the command's 7\n%v", res.code, res)
		}
		var key string
		var token uint64
		if _, err := fmt.Sscanf(res.stdout, "key=%s token=%d", &key, &token); err != nil || key != "jobs/a" || token == 0 {
			t.Errorf("command saw %q, want key=jobs/a and a non-zero token", res.stdout)
		}
		// Released when the command exited: another holder gets it at once.
		if info, err := srv.Client.Inspect(context.Background(), "jobs/a"); err != nil || info.Held {
			t.Errorf("after lockd run: Inspect = %+v, %v; want free", info, err)
		}

		if res := lockd(t, environ, "run", "jobs/a", "true"); res.code != 0 {
			t.Errorf("run without --: %v", res)
		}
		if res := lockd(t, environ, "run", "jobs/a", "--", "sh", "-c", "kill -9 $$"); res.code != 128+9 {
			t.Errorf("command killed by SIGKILL: exit %d, want 137\n%v", res.code, res)
		}
		if res := lockd(t, environ, "run", "jobs/a", "--", "/nonexistent/cmd"); res.code != 127 || !strings.Contains(res.stderr, "/nonexistent/cmd") {
			t.Errorf("missing command: %v, want exit 127 naming it", res)
		}
	})
}

// TestRunSerializes runs three `lockd run` on one key at once. Each command
// takes a directory as a mutex (mkdir fails if it exists) for a while: an
// overlap makes one of them exit 99. The tokens they see must rise in the
// order they ran.
func TestRunSerializes(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		dir := t.TempDir()
		mutex, log := filepath.Join(dir, "mutex"), filepath.Join(dir, "log")
		script := fmt.Sprintf(`mkdir %[1]s || exit 99; echo "$LOCKD_FENCING_TOKEN" >> %[2]s; sleep 0.3; rmdir %[1]s`, mutex, log)
		var runs []*running
		for range 3 {
			runs = append(runs, start(t, environ, "run", "shared", "--", "sh", "-c", script))
		}
		for i, r := range runs {
			select {
			case <-r.done:
			case <-time.After(45 * time.Second):
				info, err := srv.Client.Inspect(context.Background(), "shared")
				t.Logf("run %d still running; key: %+v %v; log %q", i, info, err, fileContent(t, log))
			}
			if res := r.wait(t, 60*time.Second); res.code != 0 {
				t.Errorf("run %d: %v", i, res)
			}
		}
		lines := strings.Fields(fileContent(t, log))
		if len(lines) != 3 {
			t.Fatalf("log has %q, want 3 tokens", lines)
		}
		var prev uint64
		for _, l := range lines {
			tok, err := strconv.ParseUint(l, 10, 64)
			if err != nil || tok <= prev {
				t.Errorf("tokens in run order %q: not strictly increasing", lines)
			}
			prev = tok
		}
	})
}

// TestRunRevokeKills revokes the lock while the command runs: the command's
// process group gets SIGTERM at once, lockd run exits 75.
func TestRunRevokeKills(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		pidFile := tempFile(t, "pid")
		// The shell starts a grandchild (sleep) in the same process group.
		r := start(t, environ, "run", "--grace", "10s", "victim", "--",
			"sh", "-c", fmt.Sprintf(`sleep 60 & echo $! > %s.tmp; mv %[1]s.tmp %[1]s; wait`, pidFile))
		testkit.Eventually(t, 30*time.Second, "the command to start", func() bool { return fileContent(t, pidFile) != "" })
		pid, err := strconv.Atoi(strings.TrimSpace(fileContent(t, pidFile)))
		if err != nil {
			t.Fatal(err)
		}
		revoked := time.Now()
		if res := lockd(t, environ, "revoke", "victim"); res.code != 0 || !strings.HasPrefix(res.stdout, "revoked victim (token ") {
			t.Fatalf("revoke: %v", res)
		}
		res := r.wait(t, 30*time.Second)
		if res.code != ExitLockLost || !strings.Contains(res.stderr, `lost the lock on "victim"`) {
			t.Errorf("lockd run after revoke: %v, want exit 75 and a message", res)
		}
		// SIGTERM kills sh and sleep at once: well within the 10s grace.
		if took := time.Since(revoked); took > 8*time.Second {
			t.Errorf("lockd run took %v after the revoke, want well under the grace", took)
		}
		testkit.Eventually(t, 5*time.Second, "the grandchild to be gone", func() bool {
			return syscall.Kill(pid, 0) != nil
		})
	})
}

// TestRunRevokeGraceKill: a command ignoring SIGTERM is SIGKILLed after
// --grace.
func TestRunRevokeGraceKill(t *testing.T) {
	t.Parallel()
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{})
	environ := []string{EnvServer + "=" + srv.Addr, "PATH=" + os.Getenv("PATH")}
	ready := tempFile(t, "ready")
	r := start(t, environ, "run", "--grace", "1s", "stubborn", "--",
		"sh", "-c", fmt.Sprintf(`trap '' TERM; touch %s; sleep 60`, ready))
	testkit.Eventually(t, 30*time.Second, "the command to start", func() bool { return fileContent(t, ready) != "" || fileExists(ready) })
	revoked := time.Now()
	if _, err := srv.Client.Revoke(context.Background(), "stubborn"); err != nil {
		t.Fatal(err)
	}
	res := r.wait(t, 30*time.Second)
	took := time.Since(revoked)
	if res.code != ExitLockLost {
		t.Errorf("exit %d, want 75\n%v", res.code, res)
	}
	if took < time.Second || took > 10*time.Second {
		t.Errorf("lockd run ended %v after the revoke, want about the 1s grace", took)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestRunWait covers --wait: 0 tries once, a duration times out, and without
// it lockd run waits until the holder releases.
func TestRunWait(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, srv *lockdtest.Server, environ []string) {
		l := hold(t, srv.Client, "busy")

		res := lockd(t, environ, "run", "--wait", "0", "busy", "--", "true")
		if res.code != ExitLocked || !strings.Contains(res.stderr, `"busy" is locked (held by token `+strconv.FormatUint(l.Token(), 10)) {
			t.Errorf("--wait 0 on a held key: %v", res)
		}
		res = lockd(t, environ, "run", "--wait", "700ms", "busy", "--", "true")
		if res.code != ExitWaitTimeout || !strings.Contains(res.stderr, "timed out after --wait 700ms") {
			t.Errorf("--wait 700ms on a held key: %v", res)
		}
		r := start(t, environ, "run", "busy", "--", "sh", "-c", `echo "$LOCKD_FENCING_TOKEN"`)
		testkit.Eventually(t, 30*time.Second, "lockd run to queue", func() bool {
			return strings.Contains(r.stderr.String(), "waiting for")
		})
		// Not a terminal: one plain status line while waiting. Checked on
		// this run, which waits until its first wait update has come: the
		// --wait 700ms run above may time out before it (a loaded CI run,
		// r36).
		if line := r.stderr.String(); !strings.Contains(line, `lockd run: waiting for "busy": held by token `) || strings.Contains(line, "\r") {
			t.Errorf("no plain waiting line on stderr:\n%s", line)
		}
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		res = r.wait(t, 30*time.Second)
		tok, err := strconv.ParseUint(strings.TrimSpace(res.stdout), 10, 64)
		if res.code != 0 || err != nil || tok <= l.Token() {
			t.Errorf("waiting run after release: %v; want exit 0 and a token above %d", res, l.Token())
		}
		if !strings.Contains(res.stderr, `lockd run: acquired "busy" (token `) {
			t.Errorf("no acquired line after waiting:\n%s", res.stderr)
		}
	})
}

// TestRunCancel: cancelling lockd run's context without a signal terminates
// the command (SIGTERM) and lockd run exits with its status.
func TestRunCancel(t *testing.T) {
	t.Parallel()
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{})
	environ := []string{EnvServer + "=" + srv.Addr, "PATH=" + os.Getenv("PATH")}
	ready := tempFile(t, "ready")
	r := start(t, environ, "run", "k", "--", "sh", "-c",
		fmt.Sprintf(`trap 'kill $!; exit 5' TERM; sleep 60 & touch %s; wait`, ready))
	testkit.Eventually(t, 30*time.Second, "the command to start", func() bool { return fileExists(ready) })
	if res := r.stop(t, 30*time.Second); res.code != 5 {
		t.Errorf("after cancel: %v, want the command's exit 5", res)
	}
	if info, err := srv.Client.Inspect(context.Background(), "k"); err != nil || info.Held {
		t.Errorf("after lockd run: Inspect = %+v, %v; want free", info, err)
	}
}

// TestRunForwardsSignal sends SIGINT to the test process while lockd run
// runs a command (lockd run has registered for it before starting the
// command): the command's group gets SIGINT, not a SIGTERM.
func TestRunForwardsSignal(t *testing.T) {
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{})
	environ := []string{EnvServer + "=" + srv.Addr, "PATH=" + os.Getenv("PATH")}
	ready, got := tempFile(t, "ready"), tempFile(t, "got")
	r := start(t, environ, "run", "k", "--", "sh", "-c",
		fmt.Sprintf(`trap 'echo INT > %[2]s; kill $!; exit 7' INT; trap 'echo TERM > %[2]s; kill $!; exit 8' TERM; sleep 60 & touch %[1]s; wait`, ready, got))
	testkit.Eventually(t, 30*time.Second, "the command to start", func() bool { return fileExists(ready) })
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	res := r.wait(t, 30*time.Second)
	if res.code != 7 || strings.TrimSpace(fileContent(t, got)) != "INT" {
		t.Errorf("after SIGINT: %v, command got %q; want exit 7 after INT", res, fileContent(t, got))
	}
}

func TestRunUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "want KEY -- CMD"},
		{[]string{"run", "k"}, "got no CMD"},
		{[]string{"run", "k", "--"}, "got no CMD"},
		{[]string{"run", "--wait", "-1s", "k", "true"}, "--wait must not be negative"},
		{[]string{"run", "--grace", "soon", "k", "true"}, `invalid argument "soon"`},
		{[]string{"run", "--bogus", "k", "true"}, "unknown flag: --bogus"},
	}
	for _, tt := range tests {
		res := lockd(t, nil, tt.args...)
		if res.code != ExitUsage || !strings.Contains(res.stderr, tt.want) {
			t.Errorf("lockd %q: %v\nwant exit 2 and %q", tt.args, res, tt.want)
		}
	}
}

func TestRunInvalidKey(t *testing.T) {
	t.Parallel()
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{})
	environ := []string{EnvServer + "=" + srv.Addr}
	res := lockd(t, environ, "run", "bad\x00key", "--", "true")
	if res.code != ExitError || !strings.Contains(res.stderr, "invalid argument") {
		t.Errorf("run with a NUL in the key: %v", res)
	}
}

// TestRunServerGone stops the server while the command runs: the client
// cannot renew its session, stops trusting the lock at its local deadline
// (before the backend could free the key), and lockd run terminates the
// command and exits 75.
func TestRunServerGone(t *testing.T) {
	t.Parallel()
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{})
	environ := []string{EnvServer + "=" + srv.Addr, "PATH=" + os.Getenv("PATH")}
	ready := tempFile(t, "ready")
	r := start(t, environ, "run", "--grace", "1s", "k", "--", "sh", "-c", fmt.Sprintf(`echo $$ > %[1]s.tmp; mv %[1]s.tmp %[1]s; exec sleep 60`, ready))
	testkit.Eventually(t, 30*time.Second, "the command to start", func() bool { return fileExists(ready) })
	pid, err := strconv.Atoi(strings.TrimSpace(fileContent(t, ready)))
	if err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	// The local deadline is at most TTL − safety margin after the last
	// acknowledgement; then SIGTERM kills sleep at once.
	testkit.Eventually(t, lockdtest.TTL+5*time.Second, "the command to be killed", func() bool { return syscall.Kill(pid, 0) != nil })
	t.Logf("command killed %v after the server stopped (TTL %v)", time.Since(stopped), lockdtest.TTL)
	res := r.wait(t, 30*time.Second)
	if res.code != ExitLockLost || !strings.Contains(res.stderr, `lost the lock on "k"`) {
		t.Errorf("after the server stopped: %v, want exit 75", res)
	}
	// Closing the dead session is best effort and brief.
	if took := time.Since(stopped); took > lockdtest.TTL+deadSessionCloseTimeout+5*time.Second {
		t.Errorf("lockd run exited %v after the server stopped", took)
	}
}

func TestRunBadTTL(t *testing.T) {
	t.Parallel()
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{})
	res := lockd(t, []string{EnvServer + "=" + srv.Addr}, "run", "--ttl", "1s", "k", "--", "true")
	if res.code != ExitError || !strings.Contains(res.stderr, "invalid argument") {
		t.Errorf("run --ttl 1s: %v, want exit 1 and an invalid argument error", res)
	}
}
