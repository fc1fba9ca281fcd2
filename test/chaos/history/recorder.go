package history

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// line is one JSON line of a history file.
type line struct {
	// Ev is lineStart, lineInvoke, lineComplete or lineOp.
	Ev string `json:"ev"`
	Op
	// Epoch is the run epoch in Unix nanoseconds (start lines only).
	Epoch int64 `json:"epoch,omitempty"`
}

const (
	lineStart    = "start"    // Proc, Invoke = the recorder's start, Epoch
	lineInvoke   = "invoke"   // Proc, Seq, Kind, Key, Token sent, Invoke
	lineComplete = "complete" // Seq, Token returned (0: keep the invoke's), Complete, Outcome, Err
	lineOp       = "op"       // a whole operation
)

// Call is an invoked operation waiting for Recorder.Complete.
type Call struct {
	seq   uint64
	kind  Kind
	key   string
	token uint64
}

// Recorder writes one process's history file (package doc, Files). It is safe
// for concurrent use.
//
// Errors are sticky, as with bufio.Writer: the first write error is kept,
// every later call does nothing, and Err and Close return it. A process should
// treat a non-nil Close error as a failed run.
type Recorder struct {
	proc  string
	clock *Clock

	mu     sync.Mutex
	w      io.Writer
	closer io.Closer // nil if the writer is not ours
	seq    uint64
	err    error
	closed bool
}

// Create creates the history file at path (it must not exist) and returns a
// recorder for process proc writing to it.
func Create(path, proc string, clock *Clock) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history: create recorder: %w", err)
	}
	r, err := newRecorder(f, f, proc, clock)
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return r, nil
}

// NewRecorder returns a recorder for process proc writing to w, which it does
// not close. Each line is one w.Write call; w should not buffer if the
// process may be killed.
func NewRecorder(w io.Writer, proc string, clock *Clock) (*Recorder, error) {
	return newRecorder(w, nil, proc, clock)
}

func newRecorder(w io.Writer, c io.Closer, proc string, clock *Clock) (*Recorder, error) {
	if proc == "" {
		return nil, errors.New("history: new recorder: empty process id")
	}
	if clock == nil {
		return nil, errors.New("history: new recorder: nil clock")
	}
	r := &Recorder{proc: proc, clock: clock, w: w, closer: c}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.write(line{Ev: lineStart, Op: Op{Proc: proc, Invoke: clock.Now()}, Epoch: clock.Epoch().UnixNano()})
	if r.err != nil {
		return nil, r.err
	}
	return r, nil
}

// Proc returns the recorder's process id.
func (r *Recorder) Proc() string { return r.proc }

// Clock returns the recorder's clock.
func (r *Recorder) Clock() *Clock { return r.clock }

// write encodes l as one line. r.mu must be held.
func (r *Recorder) write(l line) {
	if r.err != nil {
		return
	}
	if r.closed {
		r.err = errors.New("history: write after close")
		return
	}
	b, err := json.Marshal(l)
	if err != nil {
		r.err = fmt.Errorf("history: encode line: %w", err)
		return
	}
	if _, err := r.w.Write(append(b, '\n')); err != nil {
		r.err = fmt.Errorf("history: write line: %w", err)
	}
}

// Invoke records that the process invokes an operation of kind on key, now.
// token is the token sent (Release, Write), 0 for Acquire. Every Invoke must
// be followed by Complete, unless the process dies first.
func (r *Recorder) Invoke(kind Kind, key string, token uint64) Call {
	return r.InvokeMode(kind, key, "", token)
}

// InvokeMode is Invoke for an operation of a grant of mode (Op.Mode).
func (r *Recorder) InvokeMode(kind Kind, key, mode string, token uint64) Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	c := Call{seq: r.seq, kind: kind, key: key, token: token}
	r.write(line{Ev: lineInvoke, Op: Op{Proc: r.proc, Seq: c.seq, Kind: kind, Key: key, Token: token, Mode: mode,
		Invoke: r.clock.Now()}})
	return c
}

// Complete records that the call completed now with outcome. token is the
// token the reply carried (an Acquire's grant), or 0 to keep the one sent.
// err, if not nil, is recorded as text.
func (r *Recorder) Complete(c Call, outcome Outcome, token uint64, err error) {
	now := r.clock.Now()
	op := Op{Proc: r.proc, Seq: c.seq, Kind: c.kind, Key: c.key, Token: token, Complete: now, Outcome: outcome}
	if err != nil {
		op.Err = err.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.write(line{Ev: lineComplete, Op: op})
}

// Lost records that the SDK no longer trusts the grant (key, token): its
// Done channel was observed closed now. deadline is the instant the SDK
// stopped trusting it, when the SDK exposes it (a time of this process with a
// monotonic reading, in the real clock); the zero time means "now". The op's
// invoke time is the earlier of the two, so a process that was paused across
// its deadline does not appear to have trusted the lock until it resumed.
func (r *Recorder) Lost(key string, token uint64, deadline time.Time) {
	now := r.clock.Now()
	inv := now
	if !deadline.IsZero() {
		inv = min(now, r.clock.At(deadline))
	}
	r.Record(Op{Kind: Lost, Key: key, Token: token, Invoke: inv, Complete: now, Outcome: OK})
}

// Crash records, on behalf of process proc, that the harness killed it at
// run time at (use the harness's Clock().Now() just before sending SIGKILL).
func (r *Recorder) Crash(proc string, at int64) {
	r.Record(Op{Proc: proc, Kind: Crash, Invoke: at, Complete: at, Outcome: OK})
}

// Record records a whole operation whose invoke and complete times are both
// known. An empty op.Proc means the recorder's process. Seq is assigned.
func (r *Recorder) Record(op Op) {
	if op.Proc == "" {
		op.Proc = r.proc
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	op.Seq = r.seq
	r.write(line{Ev: lineOp, Op: op})
}

// Err returns the first error the recorder met, if any.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Close closes the file (if the recorder created it) and returns the first
// error met. Calls after Close make Err report an error.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return r.err
	}
	r.closed = true
	if r.closer != nil {
		if err := r.closer.Close(); err != nil && r.err == nil {
			r.err = fmt.Errorf("history: close recorder: %w", err)
		}
	}
	return r.err
}
