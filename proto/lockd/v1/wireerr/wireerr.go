// Package wireerr is the vocabulary of the errors lockd puts on the wire: the
// google.rpc.ErrorInfo domain, one reason per error class with the gRPC code
// it travels with, and how invalid input names its field. The server
// (server/errors.go) encodes errors with it, the SDK (client/errors.go)
// decodes them with it; nobody else spells a reason.
//
// It is written by hand next to the generated package lockdv1 (the way etcd
// keeps api/v3rpc/rpctypes beside etcdserverpb); `make generate` does not
// touch it. The contract is the file comment of proto/lockd/v1/lockd.proto.
//
// A failed RPC carries a gRPC status with the code Code(reason) and, in its
// details, an ErrorInfo{Domain: Domain, Reason: reason}. An INVALID_ARGUMENT
// error also carries a google.rpc.BadRequest with one field violation: Field
// is the request field (e.g. "key", "ttl_ms"), Description says what is
// wrong with it (e.g. "key is empty"); the status message is
// "<field>: <description>". A KeepAlive reply's SessionError carries the same
// code, reason and message.
package wireerr

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

// Domain is the google.rpc.ErrorInfo domain of every error lockd puts on the
// wire.
const Domain = "lockd.lock.dev"

// ErrorInfo reasons, one per error class that crosses the wire. The comment
// names the gRPC code each travels with (Code).
const (
	ReasonInvalidArgument = "INVALID_ARGUMENT" // codes.InvalidArgument; a BadRequest names the field
	ReasonSessionDead     = "SESSION_DEAD"     // codes.FailedPrecondition; terminal
	ReasonNotOwner        = "NOT_OWNER"        // codes.PermissionDenied
	ReasonContention      = "CONTENTION"       // codes.Unavailable; retry
	ReasonNotLeader       = "NOT_LEADER"       // codes.Unavailable; retry
	ReasonUnavailable     = "UNAVAILABLE"      // codes.Unavailable; retry
	ReasonWaitTimeout     = "WAIT_TIMEOUT"     // codes.DeadlineExceeded
	ReasonLimit           = "LIMIT"            // codes.ResourceExhausted
	ReasonShuttingDown    = "SHUTTING_DOWN"    // codes.Unavailable; retry elsewhere
	// ReasonSessionSecretRequired: the call named a session but sent no
	// session secret (an SDK from before session secrets). codes.PermissionDenied.
	ReasonSessionSecretRequired = "SESSION_SECRET_REQUIRED"
	// ReasonSessionSecretMismatch: the session secret is not the session's.
	// codes.PermissionDenied.
	ReasonSessionSecretMismatch = "SESSION_SECRET_MISMATCH"
	// ReasonSessionPrincipalMismatch: the session is bound to the principal
	// that opened it and the caller is another one, whatever secret it sent
	// (C2 #ct2-ownership). codes.PermissionDenied.
	ReasonSessionPrincipalMismatch = "SESSION_PRINCIPAL_MISMATCH"
	ReasonInternal                 = "INTERNAL"        // codes.Internal; details are in the server's log
	ReasonAccessDenied             = "ACCESS_DENIED"   // codes.PermissionDenied; no access rule allows the call (C5 #ct5-auth)
	ReasonUnauthenticated          = "UNAUTHENTICATED" // codes.Unauthenticated; the caller's credentials were refused
	// ReasonLimitMismatch: an Acquire's limit or mode disagrees with the
	// kind of lock the key's holders and waiters use (C2 #ct2-multi).
	// Its code is InvalidArgument, not FailedPrecondition: older SDKs
	// take FailedPrecondition for a dead session.
	ReasonLimitMismatch = "LIMIT_MISMATCH" // codes.InvalidArgument
	// ReasonDeadlock: an Acquire's wait was refused because it closed a
	// cycle of waiting sessions (C2 #ct2-deadlock); the ErrorInfo metadata
	// MetadataKeys names the cycle's keys. codes.Aborted; never retried.
	ReasonDeadlock = "DEADLOCK"
)

// The reasons only the HTTP listener writes, for refusals made before a
// call reaches the service (C2 #ct2-http-refusals); never on gRPC.
const (
	// ReasonHostNotLoopback: a listener bound to loopback got a Host that is
	// not a loopback name (HTTP 421). codes.PermissionDenied.
	ReasonHostNotLoopback = "HOST_NOT_LOOPBACK"
	// ReasonCrossOrigin: a cross-origin browser request that is not GET,
	// HEAD or OPTIONS (HTTP 403). codes.PermissionDenied.
	ReasonCrossOrigin = "CROSS_ORIGIN"
	// ReasonNoRoute: no route has the path (HTTP 404). codes.NotFound.
	ReasonNoRoute = "NO_ROUTE"
	// ReasonMethodNotAllowed: a route has the path but not the method
	// (HTTP 405). codes.Unimplemented.
	ReasonMethodNotAllowed = "METHOD_NOT_ALLOWED"
)

// HTTPReasons lists the reasons only the HTTP listener writes, in the order
// of C2 #ct2-http-refusals.
func HTTPReasons() []string {
	return []string{ReasonHostNotLoopback, ReasonCrossOrigin, ReasonNoRoute, ReasonMethodNotAllowed}
}

// Reasons lists every reason, in the order of the proto's file comment.
func Reasons() []string {
	return []string{ReasonInvalidArgument, ReasonSessionDead, ReasonNotOwner, ReasonContention,
		ReasonNotLeader, ReasonUnavailable, ReasonWaitTimeout, ReasonLimit, ReasonShuttingDown, ReasonSessionSecretRequired,
		ReasonSessionSecretMismatch, ReasonInternal, ReasonAccessDenied, ReasonUnauthenticated, ReasonSessionPrincipalMismatch, ReasonLimitMismatch, ReasonDeadlock}
}

// Code is the gRPC code reason travels with; codes.Unknown for a reason
// that is not one of lockd's.
func Code(reason string) codes.Code {
	switch reason {
	case ReasonInvalidArgument, ReasonLimitMismatch:
		return codes.InvalidArgument
	case ReasonSessionDead:
		return codes.FailedPrecondition
	case ReasonNotOwner, ReasonAccessDenied, ReasonSessionSecretRequired, ReasonSessionSecretMismatch,
		ReasonSessionPrincipalMismatch, ReasonHostNotLoopback, ReasonCrossOrigin:
		return codes.PermissionDenied
	case ReasonNoRoute:
		return codes.NotFound
	case ReasonMethodNotAllowed:
		return codes.Unimplemented
	case ReasonUnauthenticated:
		return codes.Unauthenticated
	case ReasonContention, ReasonNotLeader, ReasonUnavailable, ReasonShuttingDown:
		return codes.Unavailable
	case ReasonWaitTimeout:
		return codes.DeadlineExceeded
	case ReasonLimit:
		return codes.ResourceExhausted
	case ReasonInternal:
		return codes.Internal
	case ReasonDeadlock:
		return codes.Aborted
	}
	return codes.Unknown
}

// Status is the status of an error of class reason with message msg: code
// Code(reason) and a lockd ErrorInfo; v, when not nil, names the invalid
// field of an INVALID_ARGUMENT error in a BadRequest.
func Status(reason, msg string, v *Violation) *status.Status {
	st := status.New(Code(reason), msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: Domain}}
	if v != nil {
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: v.Field, Description: v.Description},
		}})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st
}

// Reason returns the reason of st's lockd ErrorInfo, or "" when st carries
// none (a transport error, the caller's own cancellation or deadline).
func Reason(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == Domain {
			return info.Reason
		}
	}
	return ""
}

// Violation is the invalid request field of an INVALID_ARGUMENT error.
type Violation struct {
	Field       string // the request field, e.g. "key"
	Description string // what is wrong with it, e.g. "key is empty"
}

// FieldViolation returns the field violation of st's google.rpc.BadRequest,
// if it has one.
func FieldViolation(st *status.Status) (Violation, bool) {
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			v := br.GetFieldViolations()[0]
			return Violation{Field: v.GetField(), Description: v.GetDescription()}, true
		}
	}
	return Violation{}, false
}

// Message is the status message of an INVALID_ARGUMENT error about v:
// "<field>: <description>".
func (v Violation) Message() string { return v.Field + ": " + v.Description }
