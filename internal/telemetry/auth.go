package telemetry

import (
	"context"
	"log/slog"

	"lock.dev/lockd/store"
)

// OpSecretHash is the backend op of reading a session's secret hash
// (lockd_backend_request_seconds.op, C2 #ct2-ownership).
const OpSecretHash = "secret_hash"

// Access-control log events (C4 #ct4-logs).
const (
	EventAuthDenied       = "auth_denied"
	EventAuthReloaded     = "auth_reloaded"
	EventAuthReloadFailed = "auth_reload_failed"
	EventAuthPolicyUnsafe = "auth_policy_unsafe"
)

// Reasons a call is refused (auth_denied.reason,
// lockd_auth_denied_total.reason).
const (
	// DeniedAccess: no access rule allows the call.
	DeniedAccess = "access_denied"
	// DeniedUnauthenticated: the caller's credentials were refused.
	DeniedUnauthenticated = "unauthenticated"
	// DeniedSecretRequired: the call named a session without its secret.
	DeniedSecretRequired = "session_secret_required"
	// DeniedSecretMismatch: the secret sent is not the session's.
	DeniedSecretMismatch = "session_secret_mismatch"
	// DeniedPrincipalMismatch: the session is bound to another principal.
	DeniedPrincipalMismatch = "session_principal_mismatch"
)

// Kinds of access-control file (auth_reloaded.kind).
const (
	AuthKindPolicy = "policy"
	AuthKindTokens = "tokens"
)

// AuthDenied logs auth_denied {by, method, key, rule, reason}.
func AuthDenied(l *slog.Logger, by, method, key, rule, reason string) {
	OrDiscard(l).LogAttrs(context.Background(), slog.LevelWarn, EventAuthDenied, slog.String("by", by),
		slog.String("method", method), slog.String("key", key), slog.String("rule", rule), slog.String("reason", reason))
}

// AuthReloaded logs auth_reloaded {file, kind, entries}.
func AuthReloaded(l *slog.Logger, file, kind string, entries int) {
	OrDiscard(l).LogAttrs(context.Background(), slog.LevelInfo, EventAuthReloaded, slog.String("file", file),
		slog.String("kind", kind), slog.Int("entries", entries))
}

// AuthReloadFailed logs auth_reload_failed {file, kind, line, error}.
func AuthReloadFailed(l *slog.Logger, file, kind string, line int, err error) {
	OrDiscard(l).LogAttrs(context.Background(), slog.LevelError, EventAuthReloadFailed, slog.String("file", file),
		slog.String("kind", kind), slog.Int("line", line), slog.String("error", err.Error()))
}

type callerKey struct{}

type caller struct{ by, rule string }

// WithCaller returns ctx carrying the caller's principal and the access
// rule that allowed its call, for the audit fields (by, rule) of events the
// call causes deeper down (lock_revoked).
func WithCaller(ctx context.Context, by, rule string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller{by, rule})
}

// RuleShutdown is the rule of a session close lockd decided by itself
// (session_closed with an empty by, C4 #ct4-audit).
const RuleShutdown = "shutdown"

// WithServerClose returns ctx marking a session close that lockd decided by
// itself: session_closed {by "", rule shutdown}.
func WithServerClose(ctx context.Context) context.Context {
	return WithCaller(ctx, "", RuleShutdown)
}

// CallerOf returns what WithCaller put in ctx.
func CallerOf(ctx context.Context) (by, rule string, ok bool) {
	c, ok := ctx.Value(callerKey{}).(caller)
	return c.by, c.rule, ok
}

// AuthDenied logs auth_denied {backend, method, reason, session} for a call
// refused for its session secret: session is the public id the call named,
// never a secret.
func (g Log) AuthDenied(method, reason string, id store.SessionID) {
	g.warn(EventAuthDenied, slog.String("method", method), slog.String("reason", reason), slog.String("session", string(id)))
}

// AuthPolicyUnsafe logs auth_policy_unsafe {file, rule, reason}: the policy
// taking effect grants admin to anonymous (C5 #ct5-unsafe); reason is
// InsecureAnonymousAdmin.
func AuthPolicyUnsafe(l *slog.Logger, file, rule string) {
	OrDiscard(l).LogAttrs(context.Background(), slog.LevelWarn, EventAuthPolicyUnsafe, slog.String("file", file),
		slog.String("rule", rule), slog.String("reason", InsecureAnonymousAdmin))
}
