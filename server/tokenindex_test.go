package server

import (
	"slices"
	"testing"

	"lock.dev/lockd/store"
)

// TestTokenIndex is the cached index's bookkeeping alone (C2
// #ct2-check-token): it answers nothing until its watch is up; a read is
// kept unless an event of its key or a watch change came in between; an
// acquired or revoked event drops the key (it is read again), a release
// removes one token; a broken watch empties it.
func TestTokenIndex(t *testing.T) {
	var x tokenIndex
	if _, _, ok := x.lookup("k"); ok {
		t.Fatal("lookup before the watch is up answered")
	}
	x.watchUp()
	_, tk, ok := x.lookup("k")
	if ok || !tk.ok {
		t.Fatalf("first lookup = %v, %v; want a read ticket", tk, ok)
	}
	x.fill("k", tk, []uint64{9, 7})
	if got, _, ok := x.lookup("k"); !ok || !slices.Equal(got, []uint64{7, 9}) {
		t.Fatalf("lookup after a fill = %v, %v; want [7 9]", got, ok)
	}
	x.apply(store.Event{Kind: store.EventReleased, Key: "k", Token: 7})
	if got, _, ok := x.lookup("k"); !ok || !slices.Equal(got, []uint64{9}) {
		t.Fatalf("lookup after releasing 7 = %v, %v; want [9]", got, ok)
	}
	for _, kind := range []store.EventKind{store.EventAcquired, store.EventRevoked} {
		x.apply(store.Event{Kind: kind, Key: "k", Token: 11})
		_, tk, ok = x.lookup("k")
		if ok {
			t.Fatalf("lookup after a %v event answered from the index", kind)
		}
		// An event during the read: the read is not kept.
		x.apply(store.Event{Kind: store.EventReleased, Key: "k", Token: 11})
		x.fill("k", tk, []uint64{11})
		if _, _, ok := x.lookup("k"); ok {
			t.Fatalf("a read raced by an event was kept (after %v)", kind)
		}
	}
	_, tk, _ = x.lookup("other")
	x.watchDown()
	x.fill("other", tk, []uint64{3})
	x.watchUp()
	if _, _, ok := x.lookup("other"); ok {
		t.Fatal("a read begun before the watch broke was kept")
	}
	x.lookup("other")
	x.watchDown()
	if _, _, ok := x.lookup("other"); ok {
		t.Fatal("lookup with the watch down answered")
	}
}
