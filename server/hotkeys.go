package server

import (
	"context"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/server/internal/hotkeys"
	"lock.dev/lockd/store"
)

// The HotKeys RPC (C2 #ct2-hotkeys): the sketches of server/internal/hotkeys,
// filtered by the caller's read access as List is.

// HotKeys implements the HotKeys RPC.
func (s service) HotKeys(ctx context.Context, req *lockdv1.HotKeysRequest) (*lockdv1.HotKeysResponse, error) {
	if err := store.ValidatePrefix(req.Prefix); err != nil {
		return nil, s.toStatus(ctx, "HotKeys", invalid("prefix", err))
	}
	limit := int(req.Limit)
	switch {
	case limit == 0:
		limit = hotkeys.DefaultLimit
	case limit > hotkeys.MaxLimit:
		return nil, s.toStatus(ctx, "HotKeys", invalidf("limit", "%d; at most %d", limit, hotkeys.MaxLimit))
	}
	allow := readFilter(ctx) // auth.go; nil without a policy
	resp := &lockdv1.HotKeysResponse{WindowMs: hotkeys.Window.Milliseconds(), Enabled: s.hot != nil}
	rank := func(r hotkeys.Ranking, div uint64) []*lockdv1.HotKey {
		es := s.hot.Top(r, req.Prefix, allow, limit)
		out := make([]*lockdv1.HotKey, len(es))
		for i, e := range es {
			out[i] = &lockdv1.HotKey{Key: e.Key, Score: (e.Score + div - 1) / div, Overcount: (e.Overcount + div - 1) / div}
		}
		return out
	}
	resp.ByWait = rank(hotkeys.ByWait, 1000) // µs → ms
	resp.ByHold = rank(hotkeys.ByHold, 1000)
	resp.ByContention = rank(hotkeys.ByContention, 1)
	return resp, nil
}
