package store_test

import (
	"testing"

	"lock.dev/lockd/store"
)

func TestAdmit(t *testing.T) {
	sem := func(id store.SessionID) store.MultiEntry { return store.MultiEntry{Session: id, Limit: 2} }
	rw := func(id store.SessionID, m store.Mode) store.MultiEntry {
		return store.MultiEntry{Session: id, Limit: 1, Mode: m}
	}
	semOpt := store.AcquireOptions{Limit: 2}
	sh := store.AcquireOptions{Limit: 1, Mode: store.ModeShared}
	ex := store.AcquireOptions{Limit: 1, Mode: store.ModeExclusive}
	for _, tc := range []struct {
		name           string
		o              store.AcquireOptions
		holders, queue []store.MultiEntry
		want           store.Verdict
	}{
		{"free", semOpt, nil, nil, store.AdmitGrant},
		{"a slot left", semOpt, []store.MultiEntry{sem("a")}, nil, store.AdmitGrant},
		{"full", semOpt, []store.MultiEntry{sem("a"), sem("b")}, nil, store.AdmitWait},
		{"a slot left, someone queued", semOpt, []store.MultiEntry{sem("a")}, []store.MultiEntry{sem("q")}, store.AdmitWait},
		{"first in line", semOpt, []store.MultiEntry{sem("a")}, []store.MultiEntry{sem("me"), sem("q")}, store.AdmitGrant},
		{"another N", store.AcquireOptions{Limit: 3}, []store.MultiEntry{sem("a")}, nil, store.AdmitMismatch},
		{"another N queued", semOpt, nil, []store.MultiEntry{{Session: "q", Limit: 3}}, store.AdmitMismatch},
		{"rw on a semaphore", sh, []store.MultiEntry{sem("a")}, nil, store.AdmitMismatch},
		{"readers share", sh, []store.MultiEntry{rw("a", store.ModeShared)}, nil, store.AdmitGrant},
		{"reader behind a writer", sh, []store.MultiEntry{rw("a", store.ModeShared)}, []store.MultiEntry{rw("w", store.ModeExclusive)}, store.AdmitWait},
		{"reader while a writer holds", sh, []store.MultiEntry{rw("w", store.ModeExclusive)}, nil, store.AdmitWait},
		{"writer while a reader holds", ex, []store.MultiEntry{rw("a", store.ModeShared)}, nil, store.AdmitWait},
		{"writer alone", ex, nil, []store.MultiEntry{rw("me", store.ModeExclusive)}, store.AdmitGrant},
		// A queued request fits together with everyone ahead of it.
		{"second in line, two slots free", store.AcquireOptions{Limit: 3}, []store.MultiEntry{{Session: "a", Limit: 3}},
			[]store.MultiEntry{{Session: "q", Limit: 3}, {Session: "me", Limit: 3}}, store.AdmitGrant},
		{"second in line, one slot free", semOpt, []store.MultiEntry{sem("a")}, []store.MultiEntry{sem("q"), sem("me")}, store.AdmitWait},
		{"second in line, not queued", store.AcquireOptions{Limit: 3}, nil, []store.MultiEntry{{Session: "q", Limit: 3}}, store.AdmitWait},
		{"reader behind a reader", sh, []store.MultiEntry{rw("a", store.ModeShared)},
			[]store.MultiEntry{rw("q", store.ModeShared), rw("me", store.ModeShared)}, store.AdmitGrant},
		{"reader behind a writer and a reader", sh, nil,
			[]store.MultiEntry{rw("w", store.ModeExclusive), rw("q", store.ModeShared), rw("me", store.ModeShared)}, store.AdmitWait},
		{"writer behind a reader, nobody holds", ex, nil,
			[]store.MultiEntry{rw("q", store.ModeShared), rw("me", store.ModeExclusive)}, store.AdmitWait},
		{"reader behind a waiting writer, nobody holds", sh, nil,
			[]store.MultiEntry{rw("w", store.ModeExclusive), rw("me", store.ModeShared)}, store.AdmitWait},
	} {
		if got := store.Admit("me", tc.o, tc.holders, tc.queue); got != tc.want {
			t.Errorf("%s: Admit = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestNewAcquireOptions(t *testing.T) {
	o, err := store.NewAcquireOptions()
	if err != nil || o.Limit != 1 || o.Multi() {
		t.Fatalf("no options: %+v, %v; want the plain lock (limit 1)", o, err)
	}
	for _, bad := range [][]store.AcquireOption{
		{store.WithLimit(store.MaxLimit + 1)},
		{store.WithMode(store.Mode(9))},
		{store.WithMode(store.ModeShared), store.WithLimit(2)},
	} {
		if _, err := store.NewAcquireOptions(bad...); err == nil {
			t.Errorf("NewAcquireOptions(%v): nil error, want ErrInvalidArgument", bad)
		}
	}
	if o, err := store.NewAcquireOptions(store.WithLimit(4)); err != nil || !o.Multi() || o.RW() {
		t.Errorf("WithLimit(4): %+v, %v", o, err)
	}
}
