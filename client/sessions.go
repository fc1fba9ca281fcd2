package client

import (
	"context"
	"fmt"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// SessionInfo describes one live session, as ListSessions reports it. It
// never carries a session secret.
type SessionInfo struct {
	// ID is the session id.
	ID string
	// Principal is the principal the session is bound to; empty for a
	// session opened anonymously.
	Principal string
	// Owner and Labels are the opener's (WithOwner).
	Owner  string
	Labels map[string]string
	// TTL is the session's TTL.
	TTL time.Duration
	// Remaining is a lower bound of how long the backend keeps the
	// session alive, measured when the server read it. Listing extends
	// nothing.
	Remaining time.Duration
	// Locks is the number of locks the session holds.
	Locks int
}

// ListSessionsOptions select a page of ListSessions.
type ListSessionsOptions struct {
	// Principal lists only the sessions bound to it; a caller without
	// admin on every key may name only itself.
	Principal string
	// PageToken is the token ListSessions returned for the next page; ""
	// for the first.
	PageToken string
	// Limit is the page size: 0 means 100, at most 1000.
	Limit int
}

// ListSessions returns one page of live sessions in session id order — the
// caller's own, or every session for a caller with admin on every key —
// and the token of the next page ("" after the last page).
func (c *Client) ListSessions(ctx context.Context, opts ListSessionsOptions) ([]SessionInfo, string, error) {
	var resp *lockdv1.ListSessionsResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.api.ListSessions(ctx, &lockdv1.ListSessionsRequest{Principal: opts.Principal, PageToken: opts.PageToken,
			Limit: int32(min(max(opts.Limit, -1), wirelimits.MaxListLimit+1))})
		return fromStatus(ctx, err)
	})
	if err != nil {
		return nil, "", fmt.Errorf("list sessions: %w", err)
	}
	out := make([]SessionInfo, 0, len(resp.GetSessions()))
	for _, s := range resp.GetSessions() {
		out = append(out, SessionInfo{ID: s.GetSessionId(), Principal: s.GetPrincipal(), Owner: s.GetOwner(), Labels: s.GetLabels(),
			TTL: time.Duration(s.GetTtlMs()) * time.Millisecond, Remaining: time.Duration(s.GetRemainingMs()) * time.Millisecond,
			Locks: int(s.GetLocks())})
	}
	return out, resp.GetNextPageToken(), nil
}

// CloseSessions closes every live session bound to principal, as each
// session's own Close would (its locks released, its client told at its
// next heartbeat): an admin remedy that needs admin on every key (C2
// #ct2-close-sessions). It returns how many sessions it closed and how
// many locks they released. Retrying after an error is safe: what was
// closed stays closed.
func (c *Client) CloseSessions(ctx context.Context, principal string) (closed, released int, err error) {
	var resp *lockdv1.CloseSessionsResponse
	err = c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.api.CloseSessions(ctx, &lockdv1.CloseSessionsRequest{Principal: principal})
		return fromStatus(ctx, err)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("close sessions: %w", err)
	}
	return int(resp.GetClosed()), int(resp.GetReleased()), nil
}
