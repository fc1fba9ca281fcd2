package pgstore

import (
	"bytes"
	"slices"
	"testing"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/store"
)

func TestPrefixEnd(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"", "", false},
		{"a", "b", true},
		{"ls/", "ls0", true},
		{"a\U0010FFFF", "b", true},
		{"\U0010FFFF", "", false},
		{"x\uD7FF", "x\uE000", true},
		{"é", "ê", true},
	} {
		got, ok := prefixEnd(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("prefixEnd(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestListOrderIsBytewise(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	id := openSession(t, s)
	keys := []string{"p/B", "p/a", "p/é", "p/Z", "p/\U0010FFFF", "p/_", "q", "p"}
	for _, k := range keys {
		mustTry(t, s, id, k)
	}
	l, err := s.List(testCtx(t), "p/", "", 0)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var got []string
	for _, i := range l {
		got = append(got, i.Key)
	}
	want := []string{"p/B", "p/Z", "p/_", "p/a", "p/é", "p/\U0010FFFF"}
	if !slices.Equal(got, want) {
		t.Fatalf("List(p/) = %q, want %q (Go string order)", got, want)
	}
	locks, err := s.LocksOf(testCtx(t), id)
	if err != nil || len(locks) != len(keys) || !slices.IsSortedFunc(locks, func(a, b store.Grant) int {
		return bytesCompare(a.Key, b.Key)
	}) {
		t.Fatalf("LocksOf = %+v, %v; want all %d keys in Go string order", locks, err, len(keys))
	}
}

func bytesCompare(a, b string) int { return bytes.Compare([]byte(a), []byte(b)) }
