package wireerr

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// MetadataLimit is the ErrorInfo metadata key that names the server bound a
// LIMIT error hit (C2 #ct2-limits); its value is one of the Limit* values.
const MetadataLimit = "limit"

// The server bounds a LIMIT error can name (C2 #ct2-limits), also the
// label values of the C4 metric lockd_limit_rejections_total{limit}.
const (
	LimitSessions        = "sessions"          // lock.server.max-sessions
	LimitSessionOpens    = "session_opens"     // lock.server.max-session-opens
	LimitConnections     = "connections"       // lock.server.max-connections
	LimitStreams         = "streams"           // lock.server.max-streams
	LimitWatches         = "watches"           // lock.server.max-watches
	LimitWaiters         = "waiters"           // lock.server.max-waiters
	LimitWaitersPerKey   = "waiters_per_key"   // lock.server.max-waiters-per-key
	LimitLocksPerSession = "locks_per_session" // lock.server.max-locks-per-session
	LimitRefusals        = "refusals"          // lock.server.refusal-rate (refusals for access, per peer)
	// A principal's share (C5 #ct5-principal-limits).
	LimitPrincipalStreams      = "principal_streams"       // lock.server.principal.max-streams
	LimitPrincipalWatches      = "principal_watches"       // lock.server.principal.max-watches
	LimitPrincipalSessions     = "principal_sessions"      // lock.server.principal.max-sessions
	LimitPrincipalSessionOpens = "principal_session_opens" // lock.server.principal.max-session-opens (per second)
	LimitPrincipalConnections  = "principal_connections"   // lock.server.principal.max-connections
	LimitPrincipalWaiters      = "principal_waiters"       // lock.server.principal.max-waiters
	LimitPrincipalInflight     = "principal_inflight"      // lock.server.principal.max-inflight
)

// Limits lists every Limit* value, in the order of C2 #ct2-limits.
func Limits() []string {
	return []string{LimitSessions, LimitSessionOpens, LimitConnections, LimitStreams, LimitWatches,
		LimitWaiters, LimitWaitersPerKey, LimitLocksPerSession, LimitRefusals, LimitPrincipalStreams, LimitPrincipalWatches,
		LimitPrincipalSessions, LimitPrincipalSessionOpens, LimitPrincipalConnections, LimitPrincipalWaiters, LimitPrincipalInflight}
}

// LimitStatus is the status of a request refused by the server bound limit
// (a Limit* value): code ResourceExhausted, reason LIMIT, and the bound in
// the ErrorInfo metadata.
func LimitStatus(limit, msg string) *status.Status {
	st := status.New(Code(ReasonLimit), msg)
	info := &errdetails.ErrorInfo{Reason: ReasonLimit, Domain: Domain, Metadata: map[string]string{MetadataLimit: limit}}
	if withDetails, err := st.WithDetails(info); err == nil {
		st = withDetails
	}
	return st
}

// Limit returns the bound named by st's lockd ErrorInfo (a Limit* value),
// or "" when st is not a LIMIT error or names none.
func Limit(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == Domain && info.Reason == ReasonLimit {
			return info.GetMetadata()[MetadataLimit]
		}
	}
	return ""
}
