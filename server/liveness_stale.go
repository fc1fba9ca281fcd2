//go:build lockd_stale_control

package server

import (
	"context"
	"sync"

	"lock.dev/lockd/server/internal/sessions"
	"lock.dev/lockd/store"
)

// This file exists only in a build with the tag lockd_stale_control: the
// stale-record control of the chaos suite (test/chaos, control
// stale-record). It breaks the rule that every answer's Remaining comes from
// the backend (docs/safety.md, "Replicas over one backend"; C2 #ct2-deadline,
// #ct2-replicas) on purpose: a replica answers every heartbeat of a session it
// adopted (one it did not open), after the first, from what the store said
// then — live, the same Remaining — without asking the store again and without
// reading its grants again. The backend meanwhile lets the session expire
// (nothing keeps it alive) and grants its keys to others while the client,
// told "live" again and again, keeps trusting them; the lock-lost notices of
// such a session are dropped too (quiet), as a record that never changes
// would. The trusted-overlap checker must catch it. Never in a release build.

var (
	staleMu sync.Mutex
	stale   = map[store.SessionID]store.Liveness{}
)

// liveness is the control's: see the file comment.
func (s *Server) liveness(ctx context.Context, r *sessions.Record, m *hbMember) (store.Liveness, error) {
	staleMu.Lock()
	lv, ok := stale[r.ID()]
	staleMu.Unlock()
	if ok {
		return lv, nil
	}
	adopted := !s.sess.Seeded(r)
	lv, err := m.heartbeat(ctx, s.st, r.ID()) // keepalive_batch.go: with a batch's other entries
	if err == nil && lv.Live {
		err = s.sess.Seed(ctx, r)
	}
	if err == nil && lv.Live && adopted {
		staleMu.Lock()
		stale[r.ID()] = lv
		staleMu.Unlock()
	}
	return lv, err
}

// quiet drops the backend's events about a session answered from its stale
// record: its record never learns that its locks went.
func quiet(ev store.Event) bool {
	staleMu.Lock()
	defer staleMu.Unlock()
	_, ok := stale[ev.Session]
	return ok
}
