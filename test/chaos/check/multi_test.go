package check

import (
	"testing"

	"lock.dev/lockd/test/chaos/fenced"
	"lock.dev/lockd/test/chaos/history"
)

var multiKinds = map[string]Kind{"s": {Limit: 2}, "rw": {RW: true}}

// acquireMode is an OK acquire of a grant of mode.
func (b *hb) acquireMode(proc, key, mode string, inv, comp int64, token uint64) *hb {
	return b.add(history.Op{Proc: proc, Kind: history.Acquire, Key: key, Mode: mode, Token: token, Invoke: inv,
		Complete: comp, Outcome: history.OK})
}

func TestTooManyTrusted(t *testing.T) {
	t.Run("good", func(t *testing.T) {
		b := &hb{}
		// A semaphore of 2: a and b together, c after a's release, d after
		// b's crash; nobody joins two others.
		b.acquireMode("a", "s", "slot", 0, 10, 5).
			acquireMode("b", "s", "slot", 0, 12, 6).
			release("a", "s", 50, 51, 5, history.OK).
			acquireMode("c", "s", "slot", 5, 60, 7).
			crash("b", 70).
			acquireMode("d", "s", "slot", 20, 90, 9).
			release("c", "s", 100, 101, 7, history.OK).
			release("d", "s", 100, 101, 9, history.OK).
			// A read/write lock: two readers, a writer after both, a
			// reader after the writer's deadline.
			acquireMode("a", "rw", "shared", 0, 10, 5).
			acquireMode("b", "rw", "shared", 0, 11, 6).
			release("a", "rw", 20, 21, 5, history.OK).
			lost("b", "rw", 6, 30, 80).
			acquireMode("c", "rw", "exclusive", 15, 40, 8).
			release("c", "rw", 60, 61, 8, history.OK).
			acquireMode("a", "rw", "shared", 50, 65, 9).
			release("a", "rw", 70, 71, 9, history.OK).
			// A key not named is a plain lock.
			acquire("a", "p", 0, 1, 3).
			release("a", "p", 2, 3, 3, history.OK).
			acquire("b", "p", 1, 4, 4).
			release("b", "p", 5, 6, 4, history.OK)
		wantOK(t, TooManyTrusted(b.build(t), multiKinds))
	})
	t.Run("a third slot", func(t *testing.T) {
		b := &hb{}
		b.acquireMode("a", "s", "slot", 0, 10, 5).
			acquireMode("b", "s", "slot", 0, 12, 6).
			acquireMode("c", "s", "slot", 0, 20, 7). // a and b still trust
			release("a", "s", 50, 51, 5, history.OK).
			release("b", "s", 50, 51, 6, history.OK).
			release("c", "s", 50, 51, 7, history.OK)
		wantCaught(t, TooManyTrusted(b.build(t), multiKinds), 1, `key "s" (semaphore of 2): c trusted token 7`)
	})
	t.Run("reader past the writer's grant", func(t *testing.T) {
		b := &hb{}
		b.acquireMode("r", "rw", "shared", 0, 10, 5).
			acquireMode("w", "rw", "exclusive", 5, 30, 8). // r still trusts
			release("w", "rw", 40, 41, 8, history.OK).
			release("r", "rw", 45, 46, 5, history.OK)
		wantCaught(t, TooManyTrusted(b.build(t), multiKinds), 1, "w trusted token 8 (exclusive)", "r trusted token 5 (shared)")
	})
	t.Run("two writers", func(t *testing.T) {
		b := &hb{}
		b.acquireMode("w", "rw", "exclusive", 0, 10, 5).
			acquireMode("v", "rw", "exclusive", 5, 20, 8).
			release("w", "rw", 40, 41, 5, history.OK).
			release("v", "rw", 45, 46, 8, history.OK)
		wantCaught(t, TooManyTrusted(b.build(t), multiKinds), 1, "v trusted token 8")
	})
}

func wm(key, writer, mode string, token uint64) fenced.Write {
	return fenced.Write{Key: key, Writer: writer, Token: token, Mode: mode}
}

func TestTooManyWriters(t *testing.T) {
	t.Run("good", func(t *testing.T) {
		wantOK(t, TooManyWriters(writes(
			wm("s", "a", "slot", 5), wm("s", "b", "slot", 6), wm("s", "a", "slot", 5), wm("s", "c", "slot", 7),
			wm("s", "b", "slot", 6), wm("s", "c", "slot", 7),
			wm("rw", "a", "shared", 5), wm("rw", "b", "shared", 6), wm("rw", "a", "shared", 5), wm("rw", "b", "shared", 6),
			wm("rw", "w", "exclusive", 8), wm("rw", "w", "exclusive", 8), wm("rw", "a", "shared", 9)), multiKinds))
	})
	t.Run("a third slot", func(t *testing.T) {
		wantCaught(t, TooManyWriters(writes(
			wm("s", "a", "slot", 5), wm("s", "b", "slot", 6), wm("s", "c", "slot", 7),
			wm("s", "a", "slot", 5), wm("s", "b", "slot", 6), wm("s", "c", "slot", 7)), multiKinds),
			1, `key "s" (semaphore of 2): c (token 7, slot) wrote at #3 while a (token 5, slot, writes #1..#4), b (token 6, slot, writes #2..#5) still acted`)
	})
	t.Run("reader across a writer", func(t *testing.T) {
		wantCaught(t, TooManyWriters(writes(
			wm("rw", "r", "shared", 5), wm("rw", "w", "exclusive", 8), wm("rw", "w", "exclusive", 8), wm("rw", "r", "shared", 5)),
			multiKinds), 1, "w (token 8, exclusive) wrote at #2 while r (token 5, shared")
	})
	t.Run("plain A B A", func(t *testing.T) {
		wantCaught(t, TooManyWriters(writes(w("k", "a", 5), w("k", "b", 7), w("k", "a", 5)), nil), 1, "b (token 7) wrote at #2")
	})
}

func TestFencedSafetyModes(t *testing.T) {
	t.Run("good", func(t *testing.T) {
		wantOK(t, FencedSafety(writes(
			wm("rw", "a", "shared", 6), wm("rw", "b", "shared", 5), // readers in any order
			wm("rw", "w", "exclusive", 8), wm("rw", "c", "shared", 9), wm("rw", "v", "exclusive", 10),
			wm("s", "a", "slot", 9), wm("s", "b", "slot", 4)))) // slots: no token order
	})
	t.Run("reader after a later writer", func(t *testing.T) {
		wantCaught(t, FencedSafety(writes(wm("rw", "w", "exclusive", 8), wm("rw", "r", "shared", 5))), 1,
			"write #2 by r with token 5 (shared) accepted after #1 by w with token 8 (exclusive)")
	})
	t.Run("writer after a later reader", func(t *testing.T) {
		wantCaught(t, FencedSafety(writes(wm("rw", "r", "shared", 9), wm("rw", "w", "exclusive", 8))), 1,
			"write #2 by w with token 8 (exclusive) accepted after #1 by r with token 9 (shared)")
	})
}
