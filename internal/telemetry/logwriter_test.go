package telemetry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sink is the underlying writer of the tests: it keeps every call's bytes.
// With hold set, the first call blocks until release is closed (entered is
// closed when it starts); failN makes the first failN calls fail.
type sink struct {
	mu      sync.Mutex
	calls   [][]byte
	hold    bool
	entered chan struct{}
	release chan struct{}
	failN   int
	failed  int
	short   bool
}

func newSink() *sink {
	return &sink{entered: make(chan struct{}), release: make(chan struct{})}
}

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	first := len(s.calls) == 0 && s.failed == 0
	if s.failed < s.failN {
		s.failed++
		s.mu.Unlock()
		return 0, errBoom
	}
	s.calls = append(s.calls, bytes.Clone(p))
	s.mu.Unlock()
	if first && s.hold {
		close(s.entered)
		<-s.release
	}
	if s.short {
		return len(p) - 1, nil
	}
	return len(p), nil
}

var errBoom = errors.New("boom")

func (s *sink) written() (calls int, all string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, c := range s.calls {
		b.Write(c)
	}
	return len(s.calls), b.String()
}

func lines(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

// TestLogWriterCoalescesWhileWriteBlocked: while the first write is held
// open, 99 more lines are logged; each Write returns at once, and the 99
// go out in ONE further write (C4 #ct4-log-delivery). With the old writer
// (slog straight on stderr: one write per line) the second Write waits for
// the first and the test fails at its deadline.
func TestLogWriterCoalescesWhileWriteBlocked(t *testing.T) {
	s := newSink()
	s.hold = true
	lw := NewLogWriter(s)
	var w io.Writer = lw
	logged := make(chan int, 100)
	go func() { // exits after 100 writes (the first may wait for release)
		for i := range 100 {
			if i == 1 {
				<-s.entered // the first line's write has begun: the rest queue behind it
			}
			w.Write([]byte(lines(i, i+1))) //nolint:errcheck // the sink's result is checked below
			logged <- i
		}
	}()
	select {
	case <-s.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first line was not written within 10s")
	}
	deadline := time.After(10 * time.Second)
	for n := 0; n < 100; n++ {
		select {
		case <-logged:
		case <-deadline:
			close(s.release)
			t.Fatalf("Write returned for %d of 100 lines while the first write was held open; want all: a Write waits for the write in flight", n)
		}
	}
	close(s.release)
	if err := lw.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	calls, all := s.written()
	if all != lines(0, 100) {
		t.Fatalf("written:\n%s\nwant lines 0-99 in order", all)
	}
	if calls != 2 || string(s.calls[0]) != lines(0, 1) {
		t.Fatalf("%d write calls for 100 lines, the first %q, logged while the first write was held open; want 2 (the first line at once, then the other 99 together)", calls, s.calls[0])
	}
}

// TestLogWriterOrderAndCompleteness: 8 goroutines log 400 lines each
// through slog's JSON handler (as lockd serve does), numbered by a shared
// counter taken under the same lock as the log call; every line is written
// once, whole, and in that order, and Close returns only after the last.
func TestLogWriterOrderAndCompleteness(t *testing.T) {
	s := newSink()
	lw := NewLogWriter(s)
	l := slog.New(slog.NewJSONHandler(lw, nil))
	var (
		mu   sync.Mutex
		next int
		wg   sync.WaitGroup
	)
	for range 8 {
		wg.Add(1)
		go func() { // exits after its 400 lines
			defer wg.Done()
			for range 400 {
				mu.Lock()
				l.Info("lock_acquired", "n", next)
				next++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := lw.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	calls, all := s.written()
	got := strings.Split(strings.TrimSuffix(all, "\n"), "\n")
	if len(got) != 3200 {
		t.Fatalf("%d lines written in %d calls; want 3200", len(got), calls)
	}
	for i, line := range got {
		if want := fmt.Sprintf(`"msg":"lock_acquired","n":%d}`, i); !strings.HasSuffix(line, want) {
			t.Fatalf("line %d is %q; want it to end with %s", i, line, want)
		}
	}
	t.Logf("3200 lines in %d write calls", calls)
}

// TestLogWriterFlushAndClose: Close writes what is queued behind a held
// write before it returns; Flush returns once what was queued before it is
// written; a Write after Close goes straight to the underlying writer, in
// order; Close twice is fine.
func TestLogWriterFlushAndClose(t *testing.T) {
	s := newSink()
	s.hold = true
	lw := NewLogWriter(s)
	lw.Write([]byte(lines(0, 1))) //nolint:errcheck // queued: never an error
	<-s.entered
	for i := 1; i < 50; i++ {
		lw.Write([]byte(lines(i, i+1))) //nolint:errcheck // queued
	}
	var mu sync.Mutex
	released := false
	type result struct {
		err      error
		released bool
	}
	closed := make(chan result, 1)
	go func() { // exits when Close returns
		err := lw.Close()
		mu.Lock()
		defer mu.Unlock()
		closed <- result{err, released}
	}()
	mu.Lock()
	released = true
	mu.Unlock()
	close(s.release)
	if r := <-closed; r.err != nil || !r.released {
		t.Fatalf("Close = %v, returned after the held write was released: %v; want nil, true", r.err, r.released)
	}
	if _, all := s.written(); all != lines(0, 50) {
		t.Fatalf("after Close, written:\n%s\nwant lines 0-49", all)
	}
	if n, err := lw.Write([]byte(lines(50, 51))); n != len(lines(50, 51)) || err != nil {
		t.Fatalf("Write after Close = %d, %v", n, err)
	}
	if err := lw.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if calls, all := s.written(); all != lines(0, 51) || calls != 3 {
		t.Fatalf("after a Write after Close: %d calls, written:\n%s\nwant 3 calls, lines 0-50", calls, all)
	}

	// Flush without Close.
	s2 := newSink()
	lw2 := NewLogWriter(s2)
	defer lw2.Close()
	for i := range 20 {
		lw2.Write([]byte(lines(i, i+1))) //nolint:errcheck // queued
	}
	lw2.Flush()
	if _, all := s2.written(); all != lines(0, 20) {
		t.Fatalf("after Flush, written:\n%s\nwant lines 0-19", all)
	}
}

// TestLogWriterQueueFull: with maxQueued bytes waiting behind a held
// write, the next Write waits until the held write returns; nothing is
// dropped.
func TestLogWriterQueueFull(t *testing.T) {
	s := newSink()
	s.hold = true
	lw := NewLogWriter(s)
	lw.Write([]byte("first\n")) //nolint:errcheck // queued
	<-s.entered
	big := bytes.Repeat([]byte("x"), maxQueued)
	lw.Write(big) //nolint:errcheck // queued: the queue was empty
	var mu sync.Mutex
	released := false
	returned := make(chan bool, 1)
	go func() { // exits when its Write returns
		lw.Write([]byte("last\n")) //nolint:errcheck // queued
		mu.Lock()
		defer mu.Unlock()
		returned <- released
	}()
	mu.Lock()
	released = true
	mu.Unlock()
	close(s.release)
	if !<-returned {
		t.Fatal("a Write with the queue full returned before the held write did")
	}
	if err := lw.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, all := s.written(); all != "first\n"+string(big)+"last\n" {
		t.Fatalf("written %d bytes, want %d in order", len(all), len("first\n")+len(big)+len("last\n"))
	}
}

// TestLogWriterFailingWriter: a failed write loses its own lines only; the
// later lines are still written, Write never returns the error, and Close
// returns the first one. A writer that always fails neither hangs nor
// panics; a short write is an error.
func TestLogWriterFailingWriter(t *testing.T) {
	s := newSink()
	s.failN = 1
	lw := NewLogWriter(s)
	if n, err := lw.Write([]byte("lost\n")); n != 5 || err != nil {
		t.Fatalf("Write = %d, %v; want 5, nil", n, err)
	}
	lw.Flush()
	lw.Write([]byte("kept\n")) //nolint:errcheck // queued
	if err := lw.Close(); !errors.Is(err, errBoom) {
		t.Fatalf("Close = %v; want %v", err, errBoom)
	}
	if _, all := s.written(); all != "kept\n" {
		t.Fatalf("written %q; want %q", all, "kept\n")
	}

	always := newSink()
	always.failN = 1 << 30
	lw = NewLogWriter(always)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { // exits after its 100 lines
			defer wg.Done()
			for i := range 100 {
				if _, err := lw.Write([]byte(lines(i, i+1))); err != nil {
					t.Errorf("Write: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := lw.Close(); !errors.Is(err, errBoom) {
		t.Fatalf("Close of an always failing writer = %v; want %v", err, errBoom)
	}

	short := newSink()
	short.short = true
	lw = NewLogWriter(short)
	lw.Write([]byte("line\n")) //nolint:errcheck // queued
	if err := lw.Close(); !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("Close after a short write = %v; want %v", err, io.ErrShortWrite)
	}
}

// TestLogWriterStops: Close returns only after the goroutine has (also
// checked for every test by goleak in TestMain).
func TestLogWriterStops(t *testing.T) {
	lw := NewLogWriter(io.Discard)
	lw.Write([]byte("x\n")) //nolint:errcheck // queued
	if err := lw.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-lw.done:
	default:
		t.Fatal("Close returned before the writer's goroutine ended")
	}
}

// countingFile counts the write calls made on f.
type countingFile struct {
	f     *os.File
	calls atomic.Int64
}

func (c *countingFile) Write(p []byte) (int, error) {
	c.calls.Add(1)
	return c.f.Write(p)
}

// BenchmarkLogLines logs lock_acquired-like lines through slog's JSON
// handler into a pipe (drained by a reader, as lockd bench drains its lockd
// serve child's stderr) from parallel goroutines, straight (the writer
// before issue 24) and through a LogWriter; writes/line is the write(2)
// calls per line:
//
//	go test -run '^$' -bench LogLines -cpu 8 ./internal/telemetry/
func BenchmarkLogLines(b *testing.B) {
	for _, mode := range []string{"direct", "logwriter"} {
		b.Run(mode, func(b *testing.B) {
			r, w, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			drained := make(chan struct{})
			go func() { // exits when w is closed
				defer close(drained)
				io.Copy(io.Discard, r) //nolint:errcheck // drains until EOF
			}()
			cf := &countingFile{f: w}
			var out io.Writer = cf
			var lw *LogWriter
			if mode == "logwriter" {
				lw = NewLogWriter(cf)
				out = lw
			}
			l := slog.New(slog.NewJSONHandler(out, nil))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					l.LogAttrs(context.Background(), slog.LevelInfo, EventLockAcquired, slog.String("backend", "etcd"),
						slog.String("session", "s-0123456789abcdef"), slog.String("key", "bench/w3/1234"),
						slog.Uint64("token", 123456789), slog.Int64("waited_ms", 0))
				}
			})
			if lw != nil {
				if err := lw.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cf.calls.Load())/float64(b.N), "writes/line")
			w.Close()
			<-drained
			r.Close()
		})
	}
}
