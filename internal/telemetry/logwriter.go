package telemetry

import (
	"io"
	"sync"
)

// maxQueued is how many bytes may wait behind the write in flight before
// Write waits for it (C4 #ct4-log-delivery); maxSpare the largest buffer
// kept for reuse once written.
const (
	maxQueued = 1 << 20
	maxSpare  = 64 << 10
)

// LogWriter is the writer of lockd serve's log lines (C4
// #ct4-log-delivery). Write queues its bytes and returns; one goroutine of
// the LogWriter writes them to the underlying writer: at once when no write
// is in flight (no timer), and everything queued while one was in flight in
// the next single call. Bytes are written once each, in the order they were
// given, never dropped; a Write whose queue is full (maxQueued) waits for
// the write in flight. A slog handler writes each line with one Write, so a
// line is never split between writes.
//
// Close writes what is queued, stops the goroutine and waits for it; a
// Write after Close writes straight to the underlying writer. A failed
// write loses its own bytes only: later ones are still written. Safe for
// concurrent use.
type LogWriter struct {
	w io.Writer

	mu       sync.Mutex
	more     sync.Cond // the goroutine waits here for bytes or Close
	progress sync.Cond // Write (queue full) and Flush wait here for writes
	buf      []byte    // queued, not yet handed to w
	queued   int64     // bytes ever queued
	written  int64     // bytes handed to w and returned (written or failed)
	closing  bool      // Close was called: write what is queued, then stop
	stopped  bool      // the goroutine has returned: Write goes straight to w
	err      error     // the first error w returned
	done     chan struct{}
}

// NewLogWriter returns a LogWriter on w and starts its goroutine, which
// returns when Close has been called and everything queued is written.
func NewLogWriter(w io.Writer) *LogWriter {
	lw := &LogWriter{w: w, done: make(chan struct{})}
	lw.more.L = &lw.mu
	lw.progress.L = &lw.mu
	go lw.run() // exits after Close, once the queue is empty
	return lw
}

// Write queues p. It returns len(p) and no error once p is queued: a
// failure of the underlying writer is not the caller's (C4
// #ct4-log-delivery); Close reports the first one.
func (lw *LogWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	for len(lw.buf) >= maxQueued && !lw.stopped {
		lw.progress.Wait()
	}
	if lw.stopped {
		// After Close: written here, under mu, so late lines keep their
		// order.
		return lw.w.Write(p)
	}
	lw.buf = append(lw.buf, p...)
	lw.queued += int64(len(p))
	lw.more.Signal()
	return len(p), nil
}

// Flush waits until everything queued before it was called has been handed
// to the underlying writer.
func (lw *LogWriter) Flush() {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	for upTo := lw.queued; lw.written < upTo && !lw.stopped; {
		lw.progress.Wait()
	}
}

// Close writes everything queued, stops the goroutine and waits for it. It
// returns the first error the underlying writer returned, if any.
// Idempotent.
func (lw *LogWriter) Close() error {
	lw.mu.Lock()
	lw.closing = true
	lw.more.Signal()
	lw.mu.Unlock()
	<-lw.done
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.err
}

// run is the LogWriter's goroutine: it takes what is queued, writes it in
// one call, and again, until Close with nothing queued.
func (lw *LogWriter) run() {
	defer close(lw.done)
	var spare []byte
	lw.mu.Lock()
	defer lw.mu.Unlock()
	for {
		for len(lw.buf) == 0 && !lw.closing {
			lw.more.Wait()
		}
		if len(lw.buf) == 0 { // closing, and everything written
			lw.stopped = true
			lw.progress.Broadcast()
			return
		}
		out := lw.buf
		lw.buf = spare[:0]
		lw.mu.Unlock()
		n, err := lw.w.Write(out)
		if err == nil && n < len(out) {
			err = io.ErrShortWrite
		}
		lw.mu.Lock()
		if err != nil && lw.err == nil {
			lw.err = err
		}
		lw.written += int64(len(out))
		lw.progress.Broadcast()
		spare = nil
		if cap(out) <= maxSpare {
			spare = out
		}
	}
}
