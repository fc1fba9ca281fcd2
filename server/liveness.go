//go:build !lockd_stale_control

package server

import (
	"context"

	"lock.dev/lockd/server/internal/sessions"
	"lock.dev/lockd/store"
)

// liveness asks the store whether the session of a heartbeat is live (an
// entry of a batch, m, together with the batch's others) and, when it is,
// refreshes the record's grants from the store (sessions.Table.Seed). A build
// with the tag lockd_stale_control replaces it with the stale-record
// control of the chaos suite (liveness_stale.go).
func (s *Server) liveness(ctx context.Context, r *sessions.Record, m *hbMember) (store.Liveness, error) {
	lv, err := m.heartbeat(ctx, s.st, r.ID()) // keepalive_batch.go: with a batch's other entries
	if err == nil && lv.Live {
		err = s.sess.Seed(ctx, r)
	}
	return lv, err
}

// quiet reports whether route must drop ev: never, outside the control
// build.
func quiet(store.Event) bool { return false }
