package storetest

import (
	"bytes"
	"maps"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/store"
)

// testHolder checks C2 #ct2-holder: a session's owner and labels and a
// grant's value round-trip through Inspect and List of another instance,
// also for a grant handed over from a queue; a value never outlives its
// grant; SetValue needs the exact current grant; the bounds are refused.
func (s *suite) testHolder(t *testing.T) {
	sts := s.instances(t, 2)
	st, other := sts[0], sts[1]
	ctx := ctxT(t)

	const owner = "web-3 (pid 812)"
	labels := map[string]string{"job": "deploy/api", "region": "eu-1"}
	want := maps.Clone(labels)
	sess, err := st.OpenSession(ctx, LongTTL, store.WithOwner(owner, labels))
	if err != nil {
		t.Fatalf("OpenSession(WithOwner): %v", err)
	}
	labels["job"] = "changed" // the store keeps its own copy
	a := sess.ID
	b := openSession(t, other) // no owner

	check := func(what string, info store.LockInfo, owner string, labels map[string]string, value []byte) {
		t.Helper()
		if info.Owner != owner || !maps.Equal(info.Labels, labels) || !bytes.Equal(info.Value, value) {
			t.Fatalf("%s: owner %q, labels %v, value %q; want %q, %v, %q", what, info.Owner, info.Labels, info.Value, owner, labels, value)
		}
	}

	g := mustTry(t, st, a, "holder/k1")
	info, found := inspect(t, other, "holder/k1")
	if !found {
		t.Fatal("Inspect from another instance: not found")
	}
	check("Inspect before SetValue", info, owner, want, nil)
	value := bytes.Repeat([]byte{0, 0xff, 'x'}, store.MaxValueBytes/3)
	if err := st.SetValue(ctx, a, g.Key, g.Token, value); err != nil {
		t.Fatalf("SetValue(%d bytes): %v", len(value), err)
	}
	info, _ = inspect(t, other, "holder/k1")
	check("Inspect from another instance", info, owner, want, value)
	list, err := other.List(ctx, "holder/", "", 0)
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %+v, %v; want one lock", list, err)
	}
	check("List from another instance", list[0], owner, want, value)

	// Only the exact current grant takes a value.
	wantErr(t, "SetValue(stale token)", st.SetValue(ctx, a, g.Key, g.Token+1, []byte("x")), store.ErrNotOwner)
	wantErr(t, "SetValue(other session)", other.SetValue(ctx, b, g.Key, g.Token, []byte("x")), store.ErrNotOwner)
	wantErr(t, "SetValue(free key)", st.SetValue(ctx, a, "holder/free", g.Token, []byte("x")), store.ErrNotOwner)

	// A value never outlives its grant: the next holder (no owner, no
	// value) shows neither.
	mustRelease(t, st, g)
	g2 := mustTry(t, other, b, "holder/k1")
	info, _ = inspect(t, st, "holder/k1")
	check("Inspect after a new grant", info, "", nil, nil)
	mustRelease(t, other, g2)

	// A grant handed over from the queue carries the new holder's owner.
	gb := mustTry(t, other, b, "holder/k2")
	ch := startAcquire(t, ctx, st, a, "holder/k2")
	waitersAre(t, other, "holder/k2", []store.SessionID{a})
	mustRelease(t, other, gb)
	r := recvResult(t, ch, 30*time.Second, "hand-over")
	if r.err != nil {
		t.Fatalf("Acquire after hand-over: %v", r.err)
	}
	if err := st.SetValue(ctx, a, r.g.Key, r.g.Token, []byte("leader-1")); err != nil {
		t.Fatalf("SetValue after hand-over: %v", err)
	}
	info, _ = inspect(t, other, "holder/k2")
	check("Inspect after hand-over", info, owner, want, []byte("leader-1"))

	// Bounds.
	long := strings.Repeat("x", store.MaxOwnerBytes+1)
	nine := map[string]string{}
	for i := range store.MaxLabels + 1 {
		nine[string(rune('a'+i))] = "v"
	}
	for _, tc := range []struct {
		what   string
		owner  string
		labels map[string]string
	}{
		{"owner too long", long, nil},
		{"owner with a terminal escape", "web\x1b[31m", nil},
		{"owner not UTF-8", "web\xff", nil},
		{"too many labels", "", nine},
		{"empty label key", "", map[string]string{"": "v"}},
		{"label key too long", "", map[string]string{strings.Repeat("k", store.MaxLabelBytes+1): "v"}},
		{"label value too long", "", map[string]string{"k": strings.Repeat("v", store.MaxLabelBytes+1)}},
		{"label value with a newline", "", map[string]string{"k": "a\nb"}},
	} {
		_, err := st.OpenSession(ctx, LongTTL, store.WithOwner(tc.owner, tc.labels))
		wantErr(t, "OpenSession("+tc.what+")", err, store.ErrInvalidArgument)
	}
	if _, err := st.OpenSession(ctx, LongTTL, store.WithOwner(strings.Repeat("é", store.MaxOwnerBytes/2), nil)); err != nil {
		t.Fatalf("OpenSession(owner of exactly %d bytes): %v", store.MaxOwnerBytes, err)
	}
	wantErr(t, "SetValue(too long)", st.SetValue(ctx, a, r.g.Key, r.g.Token, make([]byte, store.MaxValueBytes+1)), store.ErrInvalidArgument)
	info, _ = inspect(t, other, "holder/k2")
	check("Inspect after a refused SetValue", info, owner, want, []byte("leader-1"))
}
