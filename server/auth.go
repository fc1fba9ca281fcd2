package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// Access control at the edge (C5 #ct5-auth): one interceptor per call kind
// resolves the caller's principal and checks the call against the policy
// in force with the key or prefix it names, before the handler runs. List
// and Watch over a prefix the caller may read only in part are filtered to
// the readable keys. With a nil Authorizer (no policy) every call is
// allowed (rule no-policy), but the principal and rule still reach the
// audit fields of lock_revoked.

// lockServicePrefix is the full-method prefix of lockd.v1.LockService;
// calls to other services (health, reflection) are not checked.
var lockServicePrefix = "/" + lockdv1.LockService_ServiceDesc.ServiceName + "/"

// checkOf is what a request asks: the action and the key ("" for the
// session calls: lock on some key). List and Watch are handled apart.
func checkOf(req any) (auth.Action, string) {
	switch r := req.(type) {
	case *lockdv1.AcquireRequest:
		return auth.ActionLock, r.Key
	case *lockdv1.ReleaseRequest:
		return auth.ActionLock, r.Key
	case *lockdv1.SetValueRequest:
		return auth.ActionLock, r.Key
	case *lockdv1.LeaveQueueRequest:
		return auth.ActionLock, r.Key
	case *lockdv1.InspectRequest:
		return auth.ActionRead, r.Key
	case *lockdv1.CheckTokenRequest:
		return auth.ActionRead, r.Key
	case *lockdv1.RevokeRequest:
		return auth.ActionAdmin, r.Key
	}
	// OpenSession, CloseSession, KeepAlive.
	return auth.ActionLock, ""
}

// deny logs and counts a refused call and returns its status error; past
// the peer's refusal rate (refusals.go) it only counts it and answers LIMIT.
func (s *Server) deny(ctx context.Context, method, by, key, rule, reason string, cause error) error {
	if s.overRefusals(ctx, by) {
		return wireerr.LimitStatus(wireerr.LimitRefusals, errRefusalLimit).Err()
	}
	telemetry.AuthDenied(s.log, by, method, key, rule, reason)
	s.metrics.AuthDenied(method, reason)
	if reason == telemetry.DeniedUnauthenticated {
		return wireerr.Status(wireerr.ReasonUnauthenticated, cause.Error(), nil).Err()
	}
	return wireerr.Status(wireerr.ReasonAccessDenied, cause.Error(), nil).Err()
}

// authorize resolves the caller of ctx and checks action on key (a key, or
// the prefix of List/Watch when prefix is set). It returns the principal,
// whether results must be filtered per key (prefix only) and ctx carrying
// the caller for the audit trail.
func (s *Server) authorize(ctx context.Context, az *auth.Authorizer, method string, act auth.Action, key string, prefix bool) (context.Context, string, bool, error) {
	principal, err := az.Identify(ctx)
	if err != nil {
		return ctx, principal, false, s.deny(ctx, method, principal, key, "", telemetry.DeniedUnauthenticated,
			errors.New(strings.TrimPrefix(lastLine(err), "auth: ")))
	}
	var (
		allowed, filter bool
		rule            string
	)
	if prefix {
		var all bool
		all, allowed, rule = az.Scope(principal, act, key)
		filter = !all
	} else {
		allowed, rule = az.Decide(principal, act, key)
	}
	if !allowed {
		what := fmt.Sprintf("key %q", key)
		switch {
		case prefix:
			what = fmt.Sprintf("any key under the prefix %q", key)
		case key == "":
			what = "any key"
		}
		return ctx, principal, false, s.deny(ctx, method, principal, key, rule, telemetry.DeniedAccess,
			fmt.Errorf("access denied: %s may not %s %s", principal, act, what))
	}
	s.identifyConn(ctx, principal, method) // principal_conns.go
	s.guard.authorised(ctx)                // idle.go
	if az != nil && readFilterNeeded(act, prefix && !filter) {
		ctx = withReadFilter(ctx, az, principal) // readfilter.go
	}
	return telemetry.WithCaller(ctx, principal, rule), principal, filter, nil
}

// lastLine is the last line of a joined error (its specific cause).
func lastLine(err error) string {
	msg := err.Error()
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		return msg[i+1:]
	}
	return msg
}

// authUnary is the unary interceptor of access control.
func (s *Server) authUnary(az *auth.Authorizer) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method, ok := strings.CutPrefix(info.FullMethod, lockServicePrefix)
		if !ok {
			return handler(ctx, req)
		}
		if lr, ok := req.(*lockdv1.ListRequest); ok {
			ctx, principal, filter, err := s.authorize(ctx, az, method, auth.ActionRead, lr.Prefix, true)
			if err != nil {
				return nil, err
			}
			if !filter {
				return handler(ctx, req)
			}
			return s.filteredList(ctx, az, principal, lr, handler)
		}
		if hr, ok := req.(*lockdv1.HotKeysRequest); ok {
			ctx, _, _, err := s.authorize(ctx, az, method, auth.ActionRead, hr.Prefix, true)
			if err != nil {
				return nil, err
			}
			return handler(ctx, req) // filtered by the read filter authorize attached
		}
		if lr, ok := req.(*lockdv1.ListSessionsRequest); ok {
			ctx, err := s.authorizeSessions(ctx, az, method, lr.Principal) // sessionlist.go
			if err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}
		if _, ok := req.(*lockdv1.CloseSessionsRequest); ok {
			ctx, err := s.authorizeAdminAll(ctx, az, method) // sessionclose.go
			if err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}
		if ar, ok := req.(*lockdv1.AcquireRequest); ok && len(ar.Keys) > 0 && len(ar.Keys) <= store.MaxAcquireKeys {
			// Several keys (C2 #ct2-acquire-all): lock on every one of
			// them, or the call is refused whole. (More keys than allowed
			// are checked as the empty key; the handler refuses them.)
			for _, k := range ar.Keys {
				var err error
				if ctx, _, _, err = s.authorize(ctx, az, method, auth.ActionLock, k, false); err != nil {
					return nil, err
				}
			}
			return handler(ctx, req)
		}
		act, key := checkOf(req)
		ctx, _, _, err := s.authorize(ctx, az, method, act, key, false)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// filteredList answers a List whose prefix the caller may read only in
// part: it pages through the handler's answers keeping the readable keys
// until it has a full page or the listing ends, so that a page is short
// only at the end and a page token never names a key the caller may not
// read. The token format is List's (the base64url of the page's last key).
func (s *Server) filteredList(ctx context.Context, az *auth.Authorizer, principal string, req *lockdv1.ListRequest, handler grpc.UnaryHandler) (any, error) {
	limit, err := store.ListLimit(int(req.Limit))
	if err != nil {
		return handler(ctx, req) // the handler reports the invalid limit
	}
	out := &lockdv1.ListResponse{}
	page := proto.Clone(req).(*lockdv1.ListRequest)
	for {
		resp, err := handler(ctx, page)
		if err != nil {
			return nil, err
		}
		lr := resp.(*lockdv1.ListResponse)
		for i, l := range lr.Locks {
			if ok, _ := az.Decide(principal, auth.ActionRead, l.Key); !ok {
				continue
			}
			out.Locks = append(out.Locks, l)
			if len(out.Locks) == limit {
				if i < len(lr.Locks)-1 || lr.NextPageToken != "" {
					out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(l.Key))
				}
				return out, nil
			}
		}
		if lr.NextPageToken == "" {
			return out, nil
		}
		page.PageToken = lr.NextPageToken
	}
}

// authStream is the stream interceptor of access control: KeepAlive is
// checked when the stream opens; Watch when its request arrives (the
// handler's first RecvMsg), and its events are then filtered.
func (s *Server) authStream(az *auth.Authorizer) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		method, ok := strings.CutPrefix(info.FullMethod, lockServicePrefix)
		if !ok {
			return handler(srv, ss)
		}
		if info.FullMethod == lockdv1.LockService_Watch_FullMethodName {
			return handler(srv, &watchStream{ServerStream: ss, s: s, az: az, method: method})
		}
		ctx, _, _, err := s.authorize(ss.Context(), az, method, auth.ActionLock, "", false)
		if err != nil {
			return err
		}
		return handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
	}
}

// ctxStream is a server stream with a derived context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *ctxStream) Context() context.Context { return c.ctx }

// watchStream checks a Watch request when it is received and, when the
// caller may read only part of the prefix, drops the events of the keys it
// may not read (decided against the policy in force at each event).
type watchStream struct {
	grpc.ServerStream
	s         *Server
	az        *auth.Authorizer
	method    string
	principal string
	filter    bool
}

func (w *watchStream) RecvMsg(m any) error {
	if err := w.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	req, ok := m.(*lockdv1.WatchRequest)
	if !ok {
		return nil
	}
	var err error
	_, w.principal, w.filter, err = w.s.authorize(w.ServerStream.Context(), w.az, w.method, auth.ActionRead, req.Prefix, true)
	return err
}

// errWatchDropped is what SendMsg answers for an event it dropped: the
// handler knows the caller got nothing (a progress is due after an
// interval of what the caller got, and its cursor moves only with an event
// sent, C2 #ct2-watch-progress). It never leaves the handler.
var errWatchDropped = errors.New("server: watch event dropped by the access filter")

func (w *watchStream) SendMsg(m any) error {
	// A resync or a progress names no key and must never be dropped: the
	// client would miss that it has to re-read (C2 #ct2-watch-resume), or
	// take a live stream for a silent one (#ct2-watch-progress).
	if ev, ok := m.(*lockdv1.WatchResponse); ok && w.filter && !keyless(ev.Kind) {
		if allowed, _ := w.az.Decide(w.principal, auth.ActionRead, ev.Key); !allowed {
			return errWatchDropped
		}
	}
	return w.ServerStream.SendMsg(m)
}

// keyless reports whether a watch message kind names no key.
func keyless(k lockdv1.EventKind) bool {
	return k == lockdv1.EventKind_EVENT_KIND_RESYNC || k == lockdv1.EventKind_EVENT_KIND_PROGRESS
}
