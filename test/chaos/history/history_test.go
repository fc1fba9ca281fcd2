package history

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

func TestEpochRoundTrip(t *testing.T) {
	epoch := time.Unix(1700000000, 123456789)
	got, err := ParseEpoch(FormatEpoch(epoch))
	if err != nil {
		t.Fatalf("ParseEpoch(FormatEpoch(%v)): %v", epoch, err)
	}
	if !got.Equal(epoch) {
		t.Fatalf("ParseEpoch(FormatEpoch(%v)) = %v, want the same instant", epoch, got)
	}
	if _, err := ParseEpoch("yesterday"); err == nil {
		t.Fatal(`ParseEpoch("yesterday") = nil error, want an error`)
	}
}

// A process that got the epoch through the environment (wall clock only)
// agrees with the harness (monotonic) on run time, to well within a
// millisecond on one machine.
func TestClockAgreesAcrossProcesses(t *testing.T) {
	epoch := time.Now()
	harness := NewClock(epoch)
	t.Setenv(EpochEnv, FormatEpoch(epoch))
	worker, err := ClockFromEnv()
	if err != nil {
		t.Fatalf("ClockFromEnv: %v", err)
	}
	a := harness.Now()
	b := worker.Now()
	c := harness.Now()
	const tol = int64(time.Millisecond)
	if b < a-tol || b > c+tol {
		t.Fatalf("worker clock read %d between harness reads %d and %d (tolerance %d)", b, a, c, tol)
	}
	if a < 0 {
		t.Fatalf("harness Now() = %d right after the epoch, want >= 0", a)
	}
}

func TestClockFromEnvUnset(t *testing.T) {
	t.Setenv(EpochEnv, "")
	os.Unsetenv(EpochEnv)
	if _, err := ClockFromEnv(); err == nil {
		t.Fatalf("ClockFromEnv with %s unset = nil error, want an error", EpochEnv)
	}
}

func TestClockAtIsMonotonic(t *testing.T) {
	c := NewClock(time.Now())
	now := time.Now()
	at := c.At(now.Add(5 * time.Second))
	want := c.At(now) + int64(5*time.Second)
	if at != want {
		t.Fatalf("At(now+5s) = %d, want At(now)+5s = %d", at, want)
	}
	if d := c.Now() - c.At(now); d < 0 {
		t.Fatalf("Now() - At(earlier now) = %d, want >= 0", d)
	}
}

func newTestRecorder(t *testing.T, dir, proc string, clock *Clock) *Recorder {
	t.Helper()
	r, err := Create(filepath.Join(dir, proc+".jsonl"), proc, clock)
	if err != nil {
		t.Fatalf("Create(%s): %v", proc, err)
	}
	return r
}

func TestRecorderConcurrentRoundTrip(t *testing.T) {
	dir := t.TempDir()
	clock := NewClock(time.Now())
	r := newTestRecorder(t, dir, "w1", clock)
	const workers, perWorker = 8, 50
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			key := fmt.Sprintf("k%d", g)
			for i := range perWorker {
				c := r.Invoke(Acquire, key, 0)
				r.Complete(c, OK, uint64(g*1000+i+1), nil)
				c = r.Invoke(Release, key, uint64(g*1000+i+1))
				r.Complete(c, Fail, 0, errors.New("not owner"))
			}
		})
	}
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	h, err := ReadDir(dir, "*.jsonl")
	if err != nil {
		t.Fatalf("ReadDir: %v", err)
	}
	if got, want := len(h), workers*perWorker*2; got != want {
		t.Fatalf("ReadDir returned %d ops, want %d", got, want)
	}
	seqs := map[uint64]bool{}
	acquired := map[string]uint64{}
	for i, op := range h {
		if seqs[op.Seq] {
			t.Fatalf("seq %d appears twice", op.Seq)
		}
		seqs[op.Seq] = true
		if op.Complete == Never || op.Complete < op.Invoke {
			t.Fatalf("op %v: bad completion time", op)
		}
		if i > 0 && h[i-1].Invoke > op.Invoke {
			t.Fatalf("history not sorted by invoke at %d: %v then %v", i, h[i-1], op)
		}
		switch op.Kind {
		case Acquire:
			if op.Outcome != OK || op.Token == 0 {
				t.Fatalf("acquire %v: want ok with a token", op)
			}
			acquired[op.Key]++
		case Release:
			if op.Outcome != Fail || op.Err != "not owner" || op.Token == 0 {
				t.Fatalf("release %v: want fail, err text kept, token sent kept", op)
			}
		default:
			t.Fatalf("unexpected op %v", op)
		}
	}
	for g := range workers {
		if n := acquired[fmt.Sprintf("k%d", g)]; n != perWorker {
			t.Fatalf("key k%d has %d acquires, want %d", g, n, perWorker)
		}
	}
}

// A process killed mid-operation leaves an invoke line without completion and
// possibly a torn last line: the op reads as Unknown, completing Never.
func TestReadKilledProcess(t *testing.T) {
	var buf bytes.Buffer
	r, err := NewRecorder(&buf, "w2", NewClock(time.Now()))
	if err != nil {
		t.Fatalf("NewRecorder: %v", err)
	}
	c := r.Invoke(Acquire, "k", 0)
	r.Complete(c, OK, 7, nil)
	r.Invoke(Write, "k", 7) // killed before completion
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	buf.WriteString(`{"ev":"complete","seq":2,"outc`) // torn by the kill
	f, err := Read(&buf)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if f.Proc != "w2" || len(f.Ops) != 2 {
		t.Fatalf("Read = proc %q, %d ops; want w2, 2 ops", f.Proc, len(f.Ops))
	}
	if w := f.Ops[1]; w.Kind != Write || w.Outcome != Unknown || w.Complete != Never || w.Token != 7 {
		t.Fatalf("in-flight write read as %v, want write token=7 unknown completing never", w)
	}
	if a := f.Ops[0]; a.Outcome != OK || a.Token != 7 {
		t.Fatalf("acquire read as %v, want ok token=7", a)
	}
}

func TestReadRejectsMalformed(t *testing.T) {
	for name, text := range map[string]string{
		"empty":           "",
		"no start line":   `{"ev":"op","proc":"w","seq":1,"kind":"lost","key":"k","invoke":1,"complete":1,"outcome":"ok"}` + "\n",
		"bad json":        `{"ev":"start","proc":"w"}` + "\nnot json\n",
		"orphan complete": `{"ev":"start","proc":"w"}` + "\n" + `{"ev":"complete","seq":3,"complete":5,"outcome":"ok"}` + "\n",
		"unknown line":    `{"ev":"start","proc":"w"}` + "\n" + `{"ev":"bogus"}` + "\n",
	} {
		if _, err := Read(strings.NewReader(text)); err == nil {
			t.Errorf("Read(%s) = nil error, want an error", name)
		}
	}
}

func TestReadFilesMergesAndChecks(t *testing.T) {
	dir := t.TempDir()
	epoch := time.Now()
	clock := NewClock(epoch)
	a := newTestRecorder(t, dir, "a", clock)
	b := newTestRecorder(t, dir, "b", clock)
	harness := newTestRecorder(t, dir, "harness", clock)
	c := a.Invoke(Acquire, "k", 0)
	a.Complete(c, OK, 1, nil)
	deadline := time.Now()
	// Observation strictly later than the deadline, as after a pause.
	for clock.Now() <= clock.At(deadline) {
	}
	a.Lost("k", 1, deadline)
	c = b.Invoke(Acquire, "k", 0)
	b.Complete(c, OK, 2, nil)
	harness.Crash("b", clock.Now())
	for _, r := range []*Recorder{a, b, harness} {
		if err := r.Close(); err != nil {
			t.Fatalf("Close %s: %v", r.Proc(), err)
		}
	}
	h, err := ReadDir(dir, "*.jsonl")
	if err != nil {
		t.Fatalf("ReadDir: %v", err)
	}
	var kinds []string
	for _, op := range h {
		kinds = append(kinds, op.Proc+":"+string(op.Kind))
	}
	if got, want := strings.Join(kinds, " "), "a:acquire a:lost b:acquire b:crash"; got != want {
		t.Fatalf("merged history = %s, want %s", got, want)
	}
	lost := h[1]
	if lost.Invoke != clock.At(deadline) || lost.Complete <= lost.Invoke {
		t.Fatalf("lost = %v, want invoke at the deadline %d and a later completion", lost, clock.At(deadline))
	}
	if got := h.Keys(); len(got) != 1 || got[0] != "k" {
		t.Fatalf("Keys() = %v, want [k]", got)
	}
	if hz := h.Horizon(); hz != h[3].Invoke {
		t.Fatalf("Horizon() = %d, want the crash time %d", hz, h[3].Invoke)
	}

	// Same process twice: rejected.
	dupDir := t.TempDir()
	dup := newTestRecorder(t, dupDir, "a", clock)
	dupPath := filepath.Join(dupDir, "a.jsonl")
	if err := dup.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := ReadFiles(filepath.Join(dir, "a.jsonl"), dupPath); err == nil {
		t.Fatal("ReadFiles of two files of process a = nil error, want an error")
	}
	// Another run's epoch: rejected.
	otherDir := t.TempDir()
	other := newTestRecorder(t, otherDir, "z", NewClock(epoch.Add(-time.Hour)))
	if err := other.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := ReadFiles(filepath.Join(dir, "a.jsonl"), filepath.Join(otherDir, "z.jsonl")); err == nil {
		t.Fatal("ReadFiles across two epochs = nil error, want an error")
	}
	if _, err := ReadDir(t.TempDir(), "*.jsonl"); err == nil {
		t.Fatal("ReadDir of an empty dir = nil error, want an error")
	}
}

func TestRecorderErrors(t *testing.T) {
	dir := t.TempDir()
	clock := NewClock(time.Now())
	r := newTestRecorder(t, dir, "w", clock)
	if _, err := Create(filepath.Join(dir, "w.jsonl"), "w", clock); err == nil {
		t.Fatal("Create over an existing file = nil error, want an error")
	}
	if _, err := NewRecorder(&bytes.Buffer{}, "", clock); err == nil {
		t.Fatal("NewRecorder with an empty process id = nil error, want an error")
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	r.Invoke(Acquire, "k", 0)
	if r.Err() == nil {
		t.Fatal("Err() after Invoke on a closed recorder = nil, want an error")
	}
	if _, err := NewRecorder(failWriter{}, "w", clock); err == nil {
		t.Fatal("NewRecorder on a failing writer = nil error, want an error")
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestValidate(t *testing.T) {
	good := Op{Proc: "p", Seq: 1, Kind: Acquire, Key: "k", Invoke: 1, Complete: 2, Outcome: OK}
	if err := (History{good}).Validate(); err != nil {
		t.Fatalf("Validate(good) = %v, want nil", err)
	}
	bad := map[string]func(*Op){
		"no proc":      func(o *Op) { o.Proc = "" },
		"bad kind":     func(o *Op) { o.Kind = "grab" },
		"bad outcome":  func(o *Op) { o.Outcome = "maybe" },
		"no key":       func(o *Op) { o.Key = "" },
		"time reverse": func(o *Op) { o.Complete = 0 },
	}
	for name, mutate := range bad {
		op := good
		mutate(&op)
		if err := (History{op}).Validate(); err == nil {
			t.Errorf("Validate(%s) = nil, want an error", name)
		}
	}
	crash := Op{Proc: "p", Kind: Crash, Invoke: 3, Complete: 3, Outcome: OK}
	if err := (History{crash}).Validate(); err != nil {
		t.Fatalf("Validate(crash without key) = %v, want nil", err)
	}
}

// A grant's mode survives the invoke/complete round trip.
func TestModeRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	rec, err := NewRecorder(&buf, "p", NewClock(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	c := rec.InvokeMode(Acquire, "k", "shared", 0)
	rec.Complete(c, OK, 42, nil)
	c = rec.Invoke(Acquire, "j", 0)
	rec.Complete(c, OK, 43, nil)
	f, err := Read(&buf)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if len(f.Ops) != 2 || f.Ops[0].Mode != "shared" || f.Ops[0].Token != 42 || f.Ops[1].Mode != "" {
		t.Fatalf("ops = %v (modes %q, %q), want the shared grant 42 and a plain one", f.Ops, f.Ops[0].Mode, f.Ops[1].Mode)
	}
}

// A session open is recorded like any invoked operation: it names the key the
// process asks for next, reads back with its outcome, and one cut short by a
// kill reads as Unknown, completing Never (still a want of that key). Like
// every kind but crash it needs a key.
func TestOpenRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	rec, err := NewRecorder(&buf, "p", NewClock(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	c := rec.Invoke(Open, "k", 0)
	rec.Complete(c, Unknown, 0, errors.New("unavailable"))
	c = rec.Invoke(Open, "k", 0)
	rec.Complete(c, OK, 0, nil)
	rec.Invoke(Open, "j", 0) // killed before completion
	f, err := Read(&buf)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	want := []struct {
		key     string
		outcome Outcome
		never   bool
	}{{"k", Unknown, false}, {"k", OK, false}, {"j", Unknown, true}}
	if len(f.Ops) != len(want) {
		t.Fatalf("ops = %v, want %d opens", f.Ops, len(want))
	}
	for i, w := range want {
		op := f.Ops[i]
		if op.Kind != Open || op.Key != w.key || op.Outcome != w.outcome || (op.Complete == Never) != w.never {
			t.Fatalf("op %d = %v, want open(%q) %s (never completed: %v)", i, op, w.key, w.outcome, w.never)
		}
	}
	if f.Ops[0].Err != "unavailable" {
		t.Fatalf("failed open's error text = %q, want kept", f.Ops[0].Err)
	}
	h := History(f.Ops)
	if err := h.Validate(); err != nil {
		t.Fatalf("Validate(opens) = %v, want nil", err)
	}
	keyless := Op{Proc: "p", Seq: 9, Kind: Open, Invoke: 1, Complete: 2, Outcome: OK}
	if err := (History{keyless}).Validate(); err == nil {
		t.Fatal("Validate(open without key) = nil, want an error")
	}
}
