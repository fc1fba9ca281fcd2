package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// ListSessions (C2 #ct2-list-sessions, C5 #ct5-auth): a caller with admin
// on every key sees every session; any other authenticated caller with
// lock on some key sees only the sessions bound to its own principal.

type sessionScopeKey struct{}

// sessionScope is what the caller of ListSessions may see: every session
// (all), or those bound to principal.
type sessionScope struct {
	all       bool
	principal string
}

// authorizeSessions decides a ListSessions call whose principal filter is
// want ("" for none) and returns ctx carrying the caller and its scope.
func (s *Server) authorizeSessions(ctx context.Context, az *auth.Authorizer, method, want string) (context.Context, error) {
	principal, err := az.Identify(ctx)
	if err != nil {
		return ctx, s.deny(ctx, method, principal, "", "", telemetry.DeniedUnauthenticated,
			errors.New(strings.TrimPrefix(lastLine(err), "auth: ")))
	}
	if all, _, rule := az.Scope(principal, auth.ActionAdmin, ""); all {
		s.guard.authorised(ctx) // idle.go
		ctx = telemetry.WithCaller(ctx, principal, rule)
		return context.WithValue(ctx, sessionScopeKey{}, sessionScope{all: true}), nil
	}
	allowed, rule := az.Decide(principal, auth.ActionLock, "")
	var why string
	switch {
	case principal == auth.Anonymous:
		allowed, rule = false, auth.RuleDefaultDeny
		why = "an anonymous caller may list sessions only with admin on every key"
	case !allowed:
		why = fmt.Sprintf("%s may not lock any key, nor admin every key", principal)
	case want != "" && want != principal:
		allowed, rule = false, auth.RuleDefaultDeny
		why = fmt.Sprintf("%s may list only its own sessions (another principal's need admin on every key)", principal)
	}
	if !allowed {
		return ctx, s.deny(ctx, method, principal, "", rule, telemetry.DeniedAccess, errors.New("access denied: "+why))
	}
	s.guard.authorised(ctx) // idle.go
	ctx = telemetry.WithCaller(ctx, principal, rule)
	return context.WithValue(ctx, sessionScopeKey{}, sessionScope{principal: principal}), nil
}

// ListSessions implements the ListSessions RPC. Page tokens are the last
// session id of the previous page, base64url-encoded (opaque to clients).
func (s service) ListSessions(ctx context.Context, req *lockdv1.ListSessionsRequest) (*lockdv1.ListSessionsResponse, error) {
	scope, ok := ctx.Value(sessionScopeKey{}).(sessionScope)
	if !ok {
		return nil, status.Error(codes.Internal, "server: ListSessions without an access decision")
	}
	limit, err := store.ListLimit(int(req.Limit))
	if err != nil {
		return nil, s.toStatus(ctx, "ListSessions", invalid("limit", err))
	}
	q := store.SessionQuery{Limit: limit}
	if req.Principal != "" {
		q.Principal, q.ByPrincipal = req.Principal, true
	}
	if !scope.all {
		q.Principal, q.ByPrincipal = scope.principal, true
	}
	if len(q.Principal) > store.MaxPrincipalLen {
		return nil, s.toStatus(ctx, "ListSessions", invalidf("principal", "%d bytes, at most %d", len(q.Principal), store.MaxPrincipalLen))
	}
	if req.PageToken != "" {
		raw, derr := base64.RawURLEncoding.DecodeString(req.PageToken)
		if derr != nil || store.ValidateSessionID(store.SessionID(raw)) != nil {
			return nil, s.toStatus(ctx, "ListSessions", invalidf("page_token", "not a token returned by ListSessions"))
		}
		q.After = store.SessionID(raw)
	}
	infos, err := s.st.ListSessions(ctx, q)
	if err != nil {
		return nil, s.toStatus(ctx, "ListSessions", fmt.Errorf("list sessions: %w", err))
	}
	resp := &lockdv1.ListSessionsResponse{}
	for _, in := range infos {
		resp.Sessions = append(resp.Sessions, &lockdv1.SessionInfo{SessionId: string(in.ID), Principal: in.Principal,
			Owner: in.Owner, Labels: in.Labels, TtlMs: in.TTL.Milliseconds(), RemainingMs: max(in.Remaining, 0).Milliseconds(),
			Locks: int64(in.Locks)})
	}
	if len(infos) == limit {
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(infos[len(infos)-1].ID))
	}
	return resp, nil
}
