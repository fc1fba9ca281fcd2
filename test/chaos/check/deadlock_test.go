package check

import (
	"testing"
	"time"

	"lock.dev/lockd/test/chaos/history"
)

// pairs: P takes a then b, Q takes b then a; each holds its first key from
// 0-10 ms and waits for its second from wait ms; the refused one (err)
// answers at refusedAt, the other is granted after the refused one's
// release.
func deadlockPairs(refusedAt int64, out history.Outcome, err string) history.History {
	var b hb
	b.acquire("p", "a", 0, 10, 1)
	b.acquire("q", "b", 0, 10, 2)
	b.add(history.Op{Proc: "q", Kind: history.Acquire, Key: "a", Invoke: 20, Complete: refusedAt, Outcome: out, Err: err})
	b.release("q", "b", refusedAt+1, refusedAt+2, 2, history.OK)
	b.acquire("p", "b", 15, refusedAt+3, 3)
	b.release("p", "b", refusedAt+4, refusedAt+5, 3, history.OK)
	b.release("p", "a", refusedAt+6, refusedAt+7, 1, history.OK)
	return b.ops
}

func TestDeadlocksResolved(t *testing.T) {
	const bound = 2 * time.Second
	t.Run("refused in time", func(t *testing.T) {
		res := DeadlocksResolved(deadlockPairs(1100, history.Fail, "acquire \"a\": lockd: deadlock: keys a, b"), bound)
		if !res.OK() || res.Cycles != 1 || res.Refused != 1 || res.Max != 1080*time.Millisecond {
			t.Fatalf("a cycle refused after 1.08 s = %s; want ok, 1 cycle refused in 1.08s", res)
		}
	})
	t.Run("never refused", func(t *testing.T) { // the control: both wait until their wait timeout
		res := DeadlocksResolved(deadlockPairs(6020, history.Unknown, "acquire \"a\": lockd: wait timeout"), bound)
		if res.Violations != 1 || res.Cycles != 1 || res.Refused != 0 {
			t.Fatalf("a cycle answered after 6 s = %s; want 1 violation", res)
		}
	})
	t.Run("never answered", func(t *testing.T) {
		var b hb
		b.acquire("p", "a", 0, 10, 1).acquire("q", "b", 0, 10, 2)
		b.add(history.Op{Proc: "q", Kind: history.Acquire, Key: "a", Invoke: 20, Complete: history.Never, Outcome: history.Unknown})
		b.add(history.Op{Proc: "p", Kind: history.Acquire, Key: "b", Invoke: 20, Complete: history.Never, Outcome: history.Unknown})
		if res := DeadlocksResolved(b.ops, bound); res.Violations != 1 {
			t.Fatalf("a cycle never answered = %s; want 1 violation", res)
		}
	})
	t.Run("same order is no cycle", func(t *testing.T) {
		var b hb
		b.acquire("p", "a", 0, 10, 1)
		b.acquire("q", "a", 5, 5000, 2) // q waits for a holding nothing
		b.acquire("p", "b", 20, 30, 3)
		b.release("p", "b", 40, 41, 3, history.OK).release("p", "a", 4990, 4995, 1, history.OK)
		if res := DeadlocksResolved(b.ops, bound); !res.OK() || res.Cycles != 0 {
			t.Fatalf("waits in one order = %s; want no cycle", res)
		}
	})
	t.Run("released before the other waits", func(t *testing.T) {
		var b hb
		b.acquire("p", "a", 0, 10, 1).acquire("p", "b", 20, 30, 3)
		b.release("p", "b", 40, 41, 3, history.OK).release("p", "a", 50, 51, 1, history.OK)
		b.acquire("q", "b", 60, 70, 4).acquire("q", "a", 80, 90, 5)
		if res := DeadlocksResolved(b.ops, bound); !res.OK() || res.Cycles != 0 {
			t.Fatalf("waits one after the other = %s; want no cycle", res)
		}
	})
}
