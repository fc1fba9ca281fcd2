package etcdstore

import (
	"context"
	"fmt"

	"lock.dev/lockd/store"
)

// ExpireSession implements store.SessionRegistry. On etcd it ends the
// session at once, exactly as CloseSession does, and that keeps C2
// #ct2-replicas: a session is usable only through the Store that opened it
// (another instance reports it unknown), so nothing but this Store's
// keepalive stream keeps its lease alive. When the caller (the server whose
// client fell silent past every Remaining it granted) gives up on the
// session, the backend's expiry is this Store's decision: no other instance
// can have extended anyone's trust in it. Revoking now rather than letting
// the lease run out frees the keys a TTL earlier and changes nothing for
// safety.
//
// A session that a keepalive failure ends between the check below and the
// revoke is reported Ended although the Store already recorded its loss
// (keepalive_failed or lease_expired); the window is one round trip.
func (s *Store) ExpireSession(ctx context.Context, id store.SessionID) (store.Expiry, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Expiry{}, fmt.Errorf("etcdstore: expire session: %w", err)
	}
	s.mu.Lock()
	ss := s.sessions[id]
	gone := !s.closed && (ss == nil || ss.dead)
	s.mu.Unlock()
	if gone {
		return store.Expiry{}, fmt.Errorf("etcdstore: expire session: %w", store.ErrSessionDead)
	}
	n, err := s.closeSession(ctx, id, false) // involuntary: lock-delays run (delay.go)
	if err != nil {
		return store.Expiry{}, err
	}
	return store.Expiry{Ended: true, Released: n}, nil
}
