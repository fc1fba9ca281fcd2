package history

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Kind is what an operation did.
type Kind string

// Operation kinds.
const (
	// Acquire asks for a key; an OK reply carries the grant's fencing token.
	Acquire Kind = "acquire"
	// Release releases the grant (key, token).
	Release Kind = "release"
	// Write is a write to the fenced resource carrying the grant's token.
	Write Kind = "write"
	// Lost records that the SDK closed the lock's Done channel: the process
	// stopped trusting the grant (key, token). Its outcome is always OK.
	Lost Kind = "lost"
	// Crash records that the harness killed the process (SIGKILL). Key is
	// empty: every lock the process held is lost from the invoke time, and
	// its operations still in flight become Unknown. It is written by the
	// harness, on behalf of the killed process.
	Crash Kind = "crash"
	// Open records that the process opens a client session (a first one, or
	// a new one after losing its last) in order to acquire Key next: Key is
	// the key it asks for once the session is open. Its outcome is OK when
	// the session opened, Unknown when the attempt failed (the server may
	// have created a session nobody uses). It grants and frees nothing: only
	// the recovery checker reads it, as a want of Key, like an acquire of it
	// in flight (package check, Regrants); every other checker ignores it.
	Open Kind = "open"
)

func (k Kind) valid() bool {
	switch k {
	case Acquire, Release, Write, Lost, Crash, Open:
		return true
	}
	return false
}

// Outcome is how an operation ended.
type Outcome string

// Outcomes.
const (
	// OK: the operation took effect.
	OK Outcome = "ok"
	// Fail: the operation certainly did not take effect.
	Fail Outcome = "fail"
	// Unknown: the operation may or may not have taken effect.
	Unknown Outcome = "unknown"
)

func (o Outcome) valid() bool { return o == OK || o == Fail || o == Unknown }

// Never is the complete time of an operation that never completed (its process
// died with it in flight). It sorts after every real time.
const Never int64 = math.MaxInt64

// Op is one operation of one process on one key. Times are nanoseconds since
// the run's epoch (package doc, Time).
type Op struct {
	// Proc is the process (client) id: unique per process incarnation.
	Proc string `json:"proc"`
	// Seq numbers the operations of one recorder, from 1.
	Seq uint64 `json:"seq"`
	// Kind is what the operation did.
	Kind Kind `json:"kind"`
	// Key is the lock key (empty only for Crash).
	Key string `json:"key,omitempty"`
	// Token is the fencing token: returned by an OK Acquire, sent by Release
	// and Write, the lost grant's token for Lost. Tokens are at least 1;
	// 0 means none or not known.
	Token uint64 `json:"token,omitempty"`
	// Mode is the grant's mode for an Acquire or Write of a semaphore or
	// read/write key: "slot", "shared" or "exclusive" (the modes of package
	// fenced); empty for a plain lock and for the other kinds.
	Mode string `json:"mode,omitempty"`
	// Invoke is when the operation was invoked.
	Invoke int64 `json:"invoke"`
	// Complete is when it completed; Never if it never did.
	Complete int64 `json:"complete"`
	// Outcome is how it ended.
	Outcome Outcome `json:"outcome"`
	// Err is the error text, if any, for humans.
	Err string `json:"err,omitempty"`
}

// String renders the operation for violation reports.
func (o Op) String() string {
	tok := ""
	if o.Token != 0 {
		tok = fmt.Sprintf(" token=%d", o.Token)
	}
	return fmt.Sprintf("%s#%d %s(%q)%s %s [%s, %s]", o.Proc, o.Seq, o.Kind, o.Key, tok, o.Outcome,
		FormatTime(o.Invoke), FormatTime(o.Complete))
}

// FormatTime renders a run time (nanoseconds since the epoch) as seconds with
// microsecond precision, or "never".
func FormatTime(t int64) string {
	if t == Never {
		return "never"
	}
	return fmt.Sprintf("%.6fs", float64(t)/1e9)
}

// History is the merged operations of a run, ordered by Invoke, then Proc,
// then Seq.
type History []Op

// Sort puts h in the History order.
func (h History) Sort() {
	slices.SortStableFunc(h, func(a, b Op) int {
		return cmp.Or(cmp.Compare(a.Invoke, b.Invoke), cmp.Compare(a.Proc, b.Proc), cmp.Compare(a.Seq, b.Seq))
	})
}

// Keys returns the distinct non-empty keys of h, sorted.
func (h History) Keys() []string {
	seen := map[string]bool{}
	var keys []string
	for _, op := range h {
		if op.Key != "" && !seen[op.Key] {
			seen[op.Key] = true
			keys = append(keys, op.Key)
		}
	}
	slices.Sort(keys)
	return keys
}

// Horizon returns the latest finite time in h (invoke or complete), or 0 for
// an empty history. Checkers use it as "the end of the run" for operations
// that never completed.
func (h History) Horizon() int64 {
	var m int64
	for _, op := range h {
		m = max(m, op.Invoke)
		if op.Complete != Never {
			m = max(m, op.Complete)
		}
	}
	return m
}

// Validate reports the first malformed operation: unknown kind or outcome,
// a missing process id or key, or a completion before the invocation.
func (h History) Validate() error {
	for _, op := range h {
		switch {
		case op.Proc == "":
			return fmt.Errorf("history: op %v: empty process id", op)
		case !op.Kind.valid():
			return fmt.Errorf("history: op %v: unknown kind %q", op, op.Kind)
		case !op.Outcome.valid():
			return fmt.Errorf("history: op %v: unknown outcome %q", op, op.Outcome)
		case op.Key == "" && op.Kind != Crash:
			return fmt.Errorf("history: op %v: empty key", op)
		case op.Complete < op.Invoke:
			return fmt.Errorf("history: op %v: completes before it is invoked", op)
		}
	}
	return nil
}
