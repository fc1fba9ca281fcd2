package check

import (
	"strings"
	"testing"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/test/chaos/history"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

const ms = int64(1_000_000) // history times are nanoseconds

// hb builds synthetic histories; times are given in milliseconds.
type hb struct {
	ops history.History
	seq uint64
}

func (b *hb) add(op history.Op) *hb {
	b.seq++
	op.Seq = b.seq
	op.Invoke *= ms
	if op.Complete != history.Never {
		op.Complete *= ms
	}
	b.ops = append(b.ops, op)
	return b
}

func (b *hb) acquire(proc, key string, inv, comp int64, token uint64) *hb {
	return b.add(history.Op{Proc: proc, Kind: history.Acquire, Key: key, Token: token, Invoke: inv, Complete: comp, Outcome: history.OK})
}

func (b *hb) acquireUnknown(proc, key string, inv, comp int64) *hb {
	return b.add(history.Op{Proc: proc, Kind: history.Acquire, Key: key, Invoke: inv, Complete: comp, Outcome: history.Unknown})
}

func (b *hb) acquireFail(proc, key string, inv, comp int64) *hb {
	return b.add(history.Op{Proc: proc, Kind: history.Acquire, Key: key, Invoke: inv, Complete: comp, Outcome: history.Fail})
}

// open: a session open made to acquire key next (OK: it opened; Unknown:
// it failed, or never completed with comp = history.Never).
func (b *hb) open(proc, key string, inv, comp int64, out history.Outcome) *hb {
	return b.add(history.Op{Proc: proc, Kind: history.Open, Key: key, Invoke: inv, Complete: comp, Outcome: out})
}

func (b *hb) release(proc, key string, inv, comp int64, token uint64, out history.Outcome) *hb {
	return b.add(history.Op{Proc: proc, Kind: history.Release, Key: key, Token: token, Invoke: inv, Complete: comp, Outcome: out})
}

// lost: the SDK's deadline (trust end) and when the process observed it.
func (b *hb) lost(proc, key string, token uint64, deadline, observed int64) *hb {
	return b.add(history.Op{Proc: proc, Kind: history.Lost, Key: key, Token: token, Invoke: deadline, Complete: observed, Outcome: history.OK})
}

func (b *hb) crash(proc string, at int64) *hb {
	return b.add(history.Op{Proc: proc, Kind: history.Crash, Invoke: at, Complete: at, Outcome: history.OK})
}

func (b *hb) build(t *testing.T) history.History {
	t.Helper()
	h := append(history.History(nil), b.ops...)
	h.Sort()
	if err := h.Validate(); err != nil {
		t.Fatalf("synthetic history invalid: %v", err)
	}
	return h
}

func wantOK(t *testing.T, r Result) {
	t.Helper()
	if !r.OK() {
		t.Fatalf("%s on a good history: want 0 violations, got\n%s", r.Checker, r)
	}
}

// wantCaught asserts the checker found exactly n violations and that a
// detail mentions each of the fragments.
func wantCaught(t *testing.T, r Result, n int, fragments ...string) {
	t.Helper()
	if r.Violations != n {
		t.Fatalf("%s on a bad history: want %d violation(s), got\n%s", r.Checker, n, r)
	}
	all := strings.Join(r.Details, "\n")
	for _, f := range fragments {
		if !strings.Contains(all, f) {
			t.Fatalf("%s details do not mention %q:\n%s", r.Checker, f, r)
		}
	}
}
