package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// CloseSessions (C2 #ct2-close-sessions, issue 23 F3): an admin closes
// every session of a principal.

// authorizeAdminAll decides a call that needs admin on every key
// (CloseSessions) and returns ctx carrying the caller for the audit trail.
func (s *Server) authorizeAdminAll(ctx context.Context, az *auth.Authorizer, method string) (context.Context, error) {
	principal, err := az.Identify(ctx)
	if err != nil {
		return ctx, s.deny(ctx, method, principal, "", "", telemetry.DeniedUnauthenticated,
			errors.New(strings.TrimPrefix(lastLine(err), "auth: ")))
	}
	all, _, rule := az.Scope(principal, auth.ActionAdmin, "")
	if !all {
		return ctx, s.deny(ctx, method, principal, "", rule, telemetry.DeniedAccess,
			fmt.Errorf("access denied: %s may not close other principals' sessions (needs admin on every key)", principal))
	}
	s.guard.authorised(ctx) // idle.go
	return telemetry.WithCaller(ctx, principal, rule), nil
}

// CloseSessions implements the CloseSessions RPC: the sessions ListSessions
// lists for the principal at the call, each closed as CloseSession closes
// it (the store logs session_closed with the caller of ctx).
func (s service) CloseSessions(ctx context.Context, req *lockdv1.CloseSessionsRequest) (*lockdv1.CloseSessionsResponse, error) {
	switch {
	case req.Principal == "":
		return nil, s.toStatus(ctx, "CloseSessions", invalidf("principal", "required"))
	case len(req.Principal) > store.MaxPrincipalLen:
		return nil, s.toStatus(ctx, "CloseSessions", invalidf("principal", "%d bytes, at most %d", len(req.Principal), store.MaxPrincipalLen))
	}
	var ids []store.SessionID
	q := store.SessionQuery{Principal: req.Principal, ByPrincipal: true, Limit: store.MaxListLimit}
	for {
		infos, err := s.st.ListSessions(ctx, q)
		if err != nil {
			return nil, s.toStatus(ctx, "CloseSessions", fmt.Errorf("list sessions: %w", err))
		}
		for _, in := range infos {
			ids = append(ids, in.ID)
		}
		if len(infos) < q.Limit {
			break
		}
		q.After = infos[len(infos)-1].ID
	}
	resp := &lockdv1.CloseSessionsResponse{}
	for _, id := range ids {
		n, closed, err := s.closeOne(ctx, id)
		if err != nil {
			return nil, s.toStatus(ctx, "CloseSessions", fmt.Errorf("close session: %w", err))
		}
		if closed {
			resp.Closed++
			resp.Released += int64(n)
		}
	}
	return resp, nil
}

// closeOne closes session id as CloseSession does, without its secret;
// closed is false for a session that had already ended.
func (s *Server) closeOne(ctx context.Context, id store.SessionID) (released int, closed bool, err error) {
	r := s.sess.Pin(id)
	defer s.sess.Unpin(r)
	if s.sess.Ending(r) {
		return 0, false, nil
	}
	s.sess.BeginClose(r)
	n, err := s.st.CloseSession(ctx, id)
	if err != nil {
		by, rule, caller := telemetry.CallerOf(ctx)
		s.sess.RetryCloseLater(r, by, rule, caller)
		return 0, false, err
	}
	s.sess.MarkGone(r)
	return n, true, nil
}
