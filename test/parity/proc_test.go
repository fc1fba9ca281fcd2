package parity

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
)

// Timeouts for child processes on a loaded two-core machine.
const (
	startTimeout = 90 * time.Second // until the ready line (embedded etcd fsyncs on start)
	stopTimeout  = 60 * time.Second // SIGTERM until exit
	killTimeout  = 30 * time.Second // SIGKILL until Wait returns
)

// binaries are the executables built once per test run.
type binaries struct {
	lockd string
	etcd  string // test/cmd/etcd
}

var (
	buildOnce sync.Once
	built     binaries
	buildErr  error
	buildDir  string // removed by TestMain
)

// build compiles cmd/lockd and test/cmd/etcd once per test binary,
// with the race detector when the test binary has it (raceEnabled), so that
// a data race in lockd fails the suite too.
func build(t *testing.T) binaries {
	t.Helper()
	buildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("find the go command on PATH: %w", err)
			return
		}
		buildDir, err = os.MkdirTemp("", "lockd-parity-bin-")
		if err != nil {
			buildErr = fmt.Errorf("create build dir: %w", err)
			return
		}
		args := []string{"build", "-o", buildDir + string(filepath.Separator)}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "lock.dev/lockd/cmd/lockd", "lock.dev/lockd/test/cmd/etcd")
		cmd := exec.Command(goBin, args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
			return
		}
		built = binaries{lockd: filepath.Join(buildDir, "lockd"), etcd: filepath.Join(buildDir, "etcd")}
	})
	if buildErr != nil {
		t.Fatalf("build: %v", buildErr)
	}
	return built
}

// proc is a child process of the test. It is killed (SIGKILL) in t.Cleanup
// if still running; its stderr is kept in a file and shown when the test
// failed, and scanned for data race reports.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stderr string        // path of the file holding its stderr
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's result, valid once exited is closed
}

// firstLine is an io.Writer for a child's stdout that hands its first line
// to line (buffered, capacity 1) and discards everything after it.
type firstLine struct {
	buf  bytes.Buffer
	line chan string
	sent bool
}

func (w *firstLine) Write(p []byte) (int, error) {
	if w.sent {
		return len(p), nil
	}
	w.buf.Write(p)
	if i := bytes.IndexByte(w.buf.Bytes(), '\n'); i >= 0 {
		w.line <- string(w.buf.Bytes()[:i])
		w.sent = true
	}
	return len(p), nil
}

// startProc starts bin with args and waits for the first stdout line,
// which must start with ready; it returns the process and that line.
func startProc(t *testing.T, name, bin string, args []string, extraEnv []string, ready string) (*proc, string) {
	t.Helper()
	p, line := launchProc(t, name, bin, args, extraEnv)
	return p, p.awaitReady(t, line, ready)
}

// launchProc starts bin with args and returns at once: the process and
// the channel its first stdout line arrives on (see awaitReady). Members
// of an etcd cluster are launched together, since none is ready before a
// quorum is up.
func launchProc(t *testing.T, name, bin string, args []string, extraEnv []string) (*proc, <-chan string) {
	t.Helper()
	errf, err := os.CreateTemp(t.TempDir(), name+"-*.stderr")
	if err != nil {
		t.Fatalf("%s: stderr file: %v", name, err)
	}
	defer errf.Close() // the child has its own descriptor
	out := &firstLine{line: make(chan string, 1)}
	cmd := exec.Command(bin, args...)
	cmd.Env = testkit.ChildEnv([]string{"LOCKD_"}, extraEnv...)
	cmd.Stdout = out
	cmd.Stderr = errf
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: start %s: %v", name, bin, err)
	}
	p := &proc{name: name, cmd: cmd, stderr: errf.Name(), exited: make(chan struct{})}
	go func() { // exits when the process has exited and its stdout is drained
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill(t)
		if t.Failed() {
			t.Logf("%s stderr (last lines):\n%s", p.name, p.stderrTail(40))
		}
	})
	return p, out.line
}

// awaitReady waits for the first stdout line of p, which must start with
// ready, and returns it.
func (p *proc) awaitReady(t *testing.T, line <-chan string, ready string) string {
	t.Helper()
	select {
	case l := <-line:
		if !strings.HasPrefix(l, ready) {
			t.Fatalf("%s printed %q; want a line starting with %q", p.name, l, ready)
		}
		return l
	case <-p.exited:
		t.Fatalf("%s exited (%v) before printing its ready line; stderr:\n%s", p.name, p.err, p.stderrTail(40))
	case <-time.After(startTimeout):
		t.Fatalf("%s printed no ready line within %v; stderr:\n%s", p.name, startTimeout, p.stderrTail(40))
	}
	return ""
}

// running reports whether the process has not exited yet.
func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL (if still running) and waits for the process to exit.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if p.running() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	select {
	case <-p.exited:
	case <-time.After(killTimeout):
		t.Errorf("%s: still running %v after SIGKILL", p.name, killTimeout)
		return
	}
	p.checkRaces(t)
}

// stop sends SIGTERM and waits for a clean exit (status 0).
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("%s: SIGTERM: %v", p.name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		t.Fatalf("%s: still running %v after SIGTERM", p.name, stopTimeout)
	}
	if p.err != nil {
		t.Errorf("%s: exit after SIGTERM: %v; want status 0; stderr:\n%s", p.name, p.err, p.stderrTail(40))
	}
	p.checkRaces(t)
}

// checkRaces fails the test if the race detector reported a data race in
// the (exited) process.
func (p *proc) checkRaces(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(p.stderr)
	if err != nil {
		t.Errorf("%s: read stderr: %v", p.name, err)
		return
	}
	if i := bytes.Index(b, []byte("WARNING: DATA RACE")); i >= 0 {
		t.Errorf("%s: the race detector reported a data race:\n%s", p.name, b[i:min(len(b), i+6000)])
	}
}

// stderrTail returns the last n lines of the process's stderr.
func (p *proc) stderrTail(n int) string {
	f, err := os.Open(p.stderr)
	if err != nil {
		return fmt.Sprintf("(read stderr: %v)", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// lockd is a running `lockd serve` child process.
type lockd struct {
	*proc
	flags   []string // backend flags, reused by restart
	addr    string   // gRPC host:port
	metrics string   // /metrics host:port
}

// Settings every lockd of the suite runs with: short TTLs keep the
// expiry scenarios fast.
const (
	ttl    = 3 * time.Second
	margin = 500 * time.Millisecond
	// slack is how much later than its bound a backend may free the locks
	// of a dead holder on a loaded machine (reaper interval, lease expiry
	// granularity, watch delivery, scheduling).
	slack = 6 * time.Second
)

// startLockd starts `lockd serve` with the backend flags and parses the
// line it prints:
//
//	lockd serving grpc=HOST:PORT metrics=HOST:PORT backend=NAME
func startLockd(t *testing.T, bins binaries, flags []string) *lockd {
	t.Helper()
	return startLockdOn(t, bins, "127.0.0.1:0", flags)
}

// startLockdOn is startLockd listening on listen (a replica restarted on
// its address: its clients' address lists stay valid).
func startLockdOn(t *testing.T, bins binaries, listen string, flags []string) *lockd {
	t.Helper()
	args := append([]string{"serve",
		"--listen", listen, "--metrics-listen", "127.0.0.1:0",
		"--session-ttl", ttl.String(), "--safety-margin", margin.String()}, flags...)
	p, line := startProc(t, "lockd", bins.lockd, args, nil, "lockd serving ")
	l := &lockd{proc: p, flags: flags}
	for _, f := range strings.Fields(line)[2:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "grpc":
			l.addr = v
		case "metrics":
			l.metrics = v
		}
	}
	if l.addr == "" || l.metrics == "" {
		t.Fatalf("lockd printed %q; want grpc= and metrics= addresses", line)
	}
	return l
}

// restart starts a new lockd on the same backend state as l, which must
// have exited (killed or stopped).
func (l *lockd) restart(t *testing.T, bins binaries) *lockd {
	t.Helper()
	if l.running() {
		t.Fatal("restart: the old lockd is still running")
	}
	return startLockd(t, bins, l.flags)
}

// startEtcd starts test/cmd/etcd on a fresh data dir, with extra flags
// (TLS), and returns its client endpoints (comma-separated). It is stopped
// with SIGTERM when the test ends.
func startEtcd(t *testing.T, bins binaries, extra ...string) string {
	t.Helper()
	p, line := startProc(t, "etcd", bins.etcd,
		append([]string{"--data-dir", filepath.Join(t.TempDir(), "etcd")}, extra...), nil, "etcd serving endpoints=")
	t.Cleanup(func() {
		if p.running() {
			p.stop(t)
		}
	})
	return strings.TrimPrefix(line, "etcd serving endpoints=")
}
