package runner

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
)

// TestWithheldHoldAnswer drives workerProc.onLine with a shell script that
// speaks the worker's protocol (a hold line, then it reads its answer): a
// trigger's withholdAck keeps the first hold's answer back until
// answerHold, which sends exactly one; the next hold is answered at once.
// The script echoes every line it reads, and the test writes markers of its
// own in between, so the order on stdin shows an early or a double answer.
func TestWithheldHoldAnswer(t *testing.T) {
	const script = `echo hold k 1 1 plain -
read a; echo got $a
read b; echo got $b
echo hold k 2 1 plain -
read c; echo got $c
read d; echo got $d
exec sleep 60`
	w := &workerProc{proc: "w0", state: "free"}
	tr := &trigger{on: "hold", fired: make(chan *workerProc, 1), action: func(w *workerProc) { w.withholdAck() }}
	w.trig.Store(tr)
	var (
		mu  sync.Mutex
		got []string
	)
	gotLines := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	p, err := startProcess("fake-worker", "/bin/sh", []string{"-c", script}, nil,
		filepath.Join(t.TempDir(), "fake.log"), func(l string) string {
			if v, ok := strings.CutPrefix(l, "got "); ok {
				mu.Lock()
				got = append(got, v)
				mu.Unlock()
				return ""
			}
			return w.onLine(l)
		})
	if err != nil {
		t.Fatal(err)
	}
	w.p = p
	t.Cleanup(func() { p.stop(10 * time.Second) })

	select {
	case <-tr.fired:
	case <-time.After(10 * time.Second):
		t.Fatal("the trigger did not fire on the hold line")
	}
	testkit.Eventually(t, 10*time.Second, "the first hold line handled", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.ackOwed
	})
	p.answer("marker") // read before any answer to the first hold
	testkit.Eventually(t, 10*time.Second, "the marker read", func() bool { return len(gotLines()) == 1 })
	w.answerHold()
	w.answerHold() // a second call sends nothing more
	testkit.Eventually(t, 10*time.Second, "both holds answered", func() bool { return len(gotLines()) == 3 })
	p.answer("end") // read next unless an answer was sent twice
	testkit.Eventually(t, 10*time.Second, "the end marker read", func() bool { return len(gotLines()) == 4 })
	if want := []string{"marker", "go", "go", "end"}; !slices.Equal(gotLines(), want) {
		t.Errorf("the script read %q; want %q", gotLines(), want)
	}
}

// TestStopWaitsForWorkerStart: stopWorkers sends SIGTERM only once a worker
// has started (created its history file, which every worker does after it
// took SIGTERM). The stand-in worker is a shell that takes SIGTERM only
// after a slow start-up, as Node does after loading the SDK; on the old
// code (SIGTERM at once) it ended by the signal: "w0.2 exited: signal:
// terminated".
func TestStopWaitsForWorkerStart(t *testing.T) {
	dir := t.TempDir()
	hist := filepath.Join(dir, "w0.2.jsonl")
	// The start-up's length models a loaded machine's Node start; the
	// harness's wait ends on the file, not on a time.
	script := `sleep 0.5; trap 'exit 0' TERM; : > "$1"; while :; do sleep 0.05; done`
	p, err := startProcess("w0.2", "/bin/sh", []string{"-c", script, "sh", hist}, nil, filepath.Join(dir, "w0.2.log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	r := &run{workers: []*workerProc{{proc: "w0.2", p: p, history: hist}}}
	if err := r.stopWorkers(); err != nil {
		t.Fatalf("stopWorkers: %v", err)
	}
	if len(r.problems) > 0 {
		t.Errorf("problems: %v", r.problems)
	}
}
