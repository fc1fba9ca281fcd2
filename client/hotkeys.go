package client

import (
	"context"
	"fmt"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// HotKey is one key of a HotKeys ranking. Score may over-estimate the key's
// true total over the window by at most Overcount, never under-estimate it
// (C2 #ct2-hotkeys).
type HotKey struct {
	Key              string
	Score, Overcount uint64
}

// HotKeysInfo is the answer of one lockd process: three rankings, hottest
// first. ByWait and ByHold score in milliseconds (summed wait before a
// grant, summed hold of ended grants), ByContention in Acquires admitted to
// wait. Enabled is false when the server keeps no statistics
// (lock.server.stats.enabled).
type HotKeysInfo struct {
	ByWait, ByHold, ByContention []HotKey
	Window                       time.Duration
	Enabled                      bool
}

// HotKeys asks the lockd process the client is connected to which keys
// under prefix were hottest over its recent window (30 to 60 s), at most
// limit per ranking (0: 10; at most 50). Keys the caller may not read are
// left out. Other replicas keep their own: ask each.
func (c *Client) HotKeys(ctx context.Context, prefix string, limit int) (HotKeysInfo, error) {
	if limit < 0 || limit > 50 {
		return HotKeysInfo{}, fmt.Errorf("hot keys %q: limit %d: want 0..50: %w", prefix, limit, ErrInvalidArgument)
	}
	var resp *lockdv1.HotKeysResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.api.HotKeys(ctx, &lockdv1.HotKeysRequest{Prefix: prefix, Limit: uint32(limit)})
		return fromStatus(ctx, err)
	})
	if err != nil {
		return HotKeysInfo{}, fmt.Errorf("hot keys %q: %w", prefix, err)
	}
	conv := func(hs []*lockdv1.HotKey) []HotKey {
		out := make([]HotKey, len(hs))
		for i, h := range hs {
			out[i] = HotKey{Key: h.GetKey(), Score: h.GetScore(), Overcount: h.GetOvercount()}
		}
		return out
	}
	return HotKeysInfo{ByWait: conv(resp.GetByWait()), ByHold: conv(resp.GetByHold()), ByContention: conv(resp.GetByContention()),
		Window: time.Duration(resp.GetWindowMs()) * time.Millisecond, Enabled: resp.GetEnabled()}, nil
}
