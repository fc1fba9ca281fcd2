package server

import (
	"context"
	"errors"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// Sessions bound to their opener's principal (docs/contracts/C2.md
// #ct2-ownership): when the caller of OpenSession has an authenticated
// principal (not anonymous), the session is bound to it, in the server's
// record and in the store (store.WithPrincipal). A later call for the
// session from another principal is refused even with the right secret.

var errPrincipalMismatch = &deniedError{reason: wireerr.ReasonSessionPrincipalMismatch, label: telemetry.DeniedPrincipalMismatch,
	msg: "the session belongs to another principal"}

// callerPrincipal is the authenticated principal of the call in ctx (put
// there by the auth interceptors), "" for an anonymous caller.
func callerPrincipal(ctx context.Context) string {
	by, _, ok := telemetry.CallerOf(ctx)
	if !ok || by == auth.Anonymous {
		return ""
	}
	return by
}

// principalOption binds a session opened by the caller of ctx to its
// principal; nil for an anonymous caller.
func principalOption(ctx context.Context) (string, store.SessionOption) {
	p := callerPrincipal(ctx)
	if p == "" {
		return "", nil
	}
	return p, store.WithPrincipal(p)
}

// checkPrincipal checks, after its secret, that the caller of ctx is the
// principal session id is bound to. nil means go on: no binding, the same
// principal, or a session the store does not know. A refusal is
// errPrincipalMismatch, logged (auth_denied, public id only) and counted.
func (s *Server) checkPrincipal(ctx context.Context, method string, id store.SessionID) error {
	want, err := s.sessionPrincipal(ctx, id)
	switch {
	case errors.Is(err, store.ErrSessionDead):
		return nil
	case err != nil:
		return err
	case want == "" || want == callerPrincipal(ctx):
		return nil
	}
	return s.refuseSession(ctx, method, errPrincipalMismatch, id)
}

// sessionPrincipal returns the principal session id is bound to: from the
// server's record when known, else from the store, remembered in the
// record if there is one. A session's principal never changes.
func (s *Server) sessionPrincipal(ctx context.Context, id store.SessionID) (string, error) {
	if p, ok := s.sess.Principal(id); ok {
		return p, nil
	}
	p, err := s.st.SessionPrincipal(ctx, id)
	if err != nil {
		return "", err
	}
	s.sess.SetPrincipal(id, p)
	return p, nil
}
