package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { lockdtest.Main(m) }

// result is a finished command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// running is a command running in the background.
type running struct {
	cancel         context.CancelFunc
	done           chan struct{}
	code           int
	stdout, stderr *testkit.LogBuffer
}

// start runs lockd args in-process in the background with the given
// environment; the test's cleanup cancels it and waits for it.
func start(t *testing.T, environ []string, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{}), stdout: &testkit.LogBuffer{}, stderr: &testkit.LogBuffer{}}
	e := &env{stdout: r.stdout, stderr: r.stderr, environ: func() []string { return environ }}
	go func() { // ends when the command returns; cleanup waits for it
		defer close(r.done)
		r.code = run(ctx, args, e)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// wait waits for the command to finish within timeout.
func (r *running) wait(t *testing.T, timeout time.Duration) result {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		t.Fatalf("command still running after %v\nstdout:\n%s\nstderr:\n%s", timeout, r.stdout, r.stderr)
	}
	return result{code: r.code, stdout: r.stdout.String(), stderr: r.stderr.String()}
}

// stop cancels the command (as main does on SIGINT) and waits for it.
func (r *running) stop(t *testing.T, timeout time.Duration) result {
	t.Helper()
	r.cancel()
	return r.wait(t, timeout)
}

// lockd runs lockd args to completion with the given environment.
func lockd(t *testing.T, environ []string, args ...string) result {
	t.Helper()
	return start(t, environ, args...).wait(t, 60*time.Second)
}

var servingLine = regexp.MustCompile(`^lockd serving grpc=(\S+) metrics=(\S+) backend=(\S+)\n$`)

// serving waits for serve's one line and returns the gRPC and metrics
// addresses.
func (r *running) serving(t *testing.T) (grpcAddr, metricsAddr, backend string) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, "lockd serve's line", func() bool {
		select {
		case <-r.done:
			t.Fatalf("lockd serve exited with %d\nstderr:\n%s", r.code, r.stderr)
		default:
		}
		return strings.HasSuffix(r.stdout.String(), "\n")
	})
	m := servingLine.FindStringSubmatch(r.stdout.String())
	if m == nil {
		t.Fatalf("lockd serve printed %q, want one line %q", r.stdout, servingLine)
	}
	return m[1], m[2], m[3]
}

// fileContent reads a file, "" if it does not exist yet.
func fileContent(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

func tempFile(t *testing.T, name string) string {
	return filepath.Join(t.TempDir(), name)
}
