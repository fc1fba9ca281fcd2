package runner

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/test/chaos/history"
)

// pythonWorkerCmd returns the interpreter and the environment of the
// Python worker as the runner starts it (pythonBinaries).
func pythonWorkerCmd(t *testing.T) (python string, env []string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	var b Binaries
	pythonBinaries(root, &b)
	r := &run{env: &Env{bins: b}}
	bin, _, env := r.pythonCommand(nil)
	return bin, env
}

// TestPythonHistoryReadable writes every kind of line with the Python
// worker's recorder (lockd._chaosworker.Recorder) and reads them with
// package history: the checkers read Python workers' histories as they
// read the Go worker's.
func TestPythonHistoryReadable(t *testing.T) {
	python, env := pythonWorkerCmd(t)
	path := filepath.Join(t.TempDir(), "w0.jsonl")
	epoch := time.Now().Add(-time.Second)
	script := `import sys
from lockd._chaosworker import Recorder, HistoryClock
r = Recorder(sys.argv[1], "w0", HistoryClock(int(sys.argv[2])))
c = r.invoke("open", "k")
r.complete(c, "ok")
c = r.invoke("acquire", "k", 0, "shared")
r.complete(c, "ok", 7)
c = r.invoke("write", "k", 7, "shared")
r.complete(c, "fail", err="fenced: stale token")
r.lost("k", 7, r.clock.now(), "why")
c = r.invoke("release", "k", 7)
assert r.close() is None
`
	cmd := exec.Command(python, "-c", script, path, history.FormatEpoch(epoch))
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("python recorder: %v\n%s", err, out)
	}
	h, err := history.ReadFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range h {
		got = append(got, string(op.Kind)+":"+string(op.Outcome)+":"+strconv.FormatUint(op.Token, 10)+":"+op.Mode)
		if op.Invoke < int64(time.Second)-int64(100*time.Millisecond) {
			t.Errorf("op %v invoked at %s: want about 1s after the epoch", op, history.FormatTime(op.Invoke))
		}
	}
	want := "open:ok:0: acquire:ok:7:shared write:fail:7:shared lost:ok:7: release:unknown:7:"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("ops %q; want %q", g, want)
	}
}

// TestPythonWorkerSurvivesStopCont pauses and resumes a Python worker
// (SIGSTOP, SIGCONT: what PauseHolder does) that cannot reach lockd: it
// must go on opening sessions afterwards, then stop cleanly on SIGTERM
// with a readable history. Python's signal.sigtimedwait returns a siginfo
// of garbage when its timeout ran out while the process was stopped, which
// the worker once took for a SIGTERM: it exited on its own after every
// pause.
func TestPythonWorkerSurvivesStopCont(t *testing.T) {
	python, env := pythonWorkerCmd(t)
	dir := t.TempDir()
	hist := filepath.Join(dir, "w0.jsonl")
	args := []string{"-m", "lockd._chaosworker", "-proc", "w0", "-lockd", "127.0.0.1:1", "-fenced", "http://127.0.0.1:1",
		"-history", hist, "-keys", "k0", "-hold-ack"}
	env = append(env, history.EpochEnv+"="+history.FormatEpoch(time.Now()))
	p, err := startProcess("w0", python, args, env, filepath.Join(dir, "w0.log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	opens := func() int {
		b, _ := os.ReadFile(hist)
		return bytes.Count(b, []byte(`"ev":"invoke","proc":"w0"`))
	}
	testkit.Eventually(t, 30*time.Second, "a session open invoked", func() bool { return opens() >= 1 })
	if !p.pause() {
		t.Fatal("the worker did not stop")
	}
	before := opens()
	// The pause's length, not a synchronisation: longer than the 0.2s
	// slices the worker's main thread waits for signals in, as every
	// PauseHolder pause is (the bug showed only then).
	time.Sleep(500 * time.Millisecond)
	p.signal(syscall.SIGCONT)
	// An open fails after the worker's open timeout (5s), then the next
	// one starts: the worker went on after the SIGCONT.
	testkit.Eventually(t, 30*time.Second, "a session open invoked after the SIGCONT", func() bool {
		return opens() > before || p.done()
	})
	if p.done() {
		t.Fatalf("the worker exited after SIGSTOP and SIGCONT: %v", p.failure())
	}
	if killed := p.stop(30 * time.Second); killed {
		t.Fatal("the worker did not exit on SIGTERM")
	}
	if err := p.err(); err != nil {
		t.Fatalf("exit: %v", p.failure())
	}
	h, err := history.ReadFiles(hist)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range h {
		if op.Kind != history.Open || op.Key != "k0" {
			t.Errorf("op %v: want only opens of k0", op)
		}
	}
}

// TestFlowControlOnly: the far link's activity ignores chunks of
// flow-control frames only (what gRPC's C core sends after each reply).
func TestFlowControlOnly(t *testing.T) {
	// Two WINDOW_UPDATEs as the Python SDK sent them after a heartbeat's
	// answer (stream 3 and the connection, 42 bytes each).
	windows := []byte{0, 0, 4, 8, 0, 0, 0, 0, 3, 0, 0, 0, 0x2a, 0, 0, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0x2a}
	pingAck := []byte{0, 0, 8, 6, 1, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}
	ping := []byte{0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}
	data := []byte{0, 0, 5, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0}
	for _, c := range []struct {
		name  string
		chunk []byte
		want  bool
	}{
		{"window updates", windows, true},
		{"ping ack after window updates", append(append([]byte{}, windows...), pingAck...), true},
		{"ping", ping, false},
		{"data", data, false},
		{"window update then data", append(append([]byte{}, windows...), data...), false},
		{"cut frame", windows[:20], false},
		{"empty", nil, false},
	} {
		if got := flowControlOnly(c.chunk); got != c.want {
			t.Errorf("%s: flowControlOnly = %v, want %v", c.name, got, c.want)
		}
	}
}
