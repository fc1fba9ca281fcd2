package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every error lockd puts on
// the wire. The SDK (client/errors.go) maps the Reason* values back to its
// sentinels.
const ErrorDomain = "lockd.lock.dev"

// ErrorInfo reasons, one per error class that crosses the wire.
const (
	ReasonInvalidArgument = "INVALID_ARGUMENT" // codes.InvalidArgument
	ReasonSessionDead     = "SESSION_DEAD"     // codes.FailedPrecondition
	ReasonNotOwner        = "NOT_OWNER"        // codes.PermissionDenied
	ReasonContention      = "CONTENTION"       // codes.Unavailable
	ReasonNotLeader       = "NOT_LEADER"       // codes.Unavailable
	ReasonUnavailable     = "UNAVAILABLE"      // codes.Unavailable
	ReasonWaitTimeout     = "WAIT_TIMEOUT"     // codes.DeadlineExceeded
	ReasonLimit           = "LIMIT"            // codes.ResourceExhausted
	ReasonShuttingDown    = "SHUTTING_DOWN"    // codes.Unavailable
	ReasonInternal        = "INTERNAL"         // codes.Internal
)

// Server-side error conditions that are not store sentinels.
var (
	errWaitTimeout  = errors.New("server: wait timeout")
	errShuttingDown = errors.New("server: shutting down")
	errLimit        = errors.New("server: limit reached")
)

// fieldError is invalid input, naming the request field it is about.
type fieldError struct {
	field string
	err   error // wraps store.ErrInvalidArgument
}

func (e *fieldError) Error() string {
	// Drop the sentinel's own text: the wire message is "field: what is wrong".
	msg := strings.TrimPrefix(e.err.Error(), store.ErrInvalidArgument.Error()+": ")
	return e.field + ": " + msg
}

func (e *fieldError) Unwrap() error { return e.err }

// invalid wraps err (which wraps store.ErrInvalidArgument) with the name of
// the request field it is about. A nil err stays nil.
func invalid(field string, err error) error {
	if err == nil {
		return nil
	}
	return &fieldError{field: field, err: err}
}

// classify maps an error to the gRPC code and ErrorInfo reason it crosses the
// wire with. ctx is the RPC's context: when it has ended, the error is the
// caller's own cancellation or deadline whatever the store said.
func (s *Server) classify(ctx context.Context, err error) (codes.Code, string, string) {
	switch {
	case errors.Is(err, errWaitTimeout):
		return codes.DeadlineExceeded, ReasonWaitTimeout, "wait timeout exceeded"
	case ctx.Err() != nil:
		st := status.FromContextError(ctx.Err())
		return st.Code(), "", st.Message()
	case errors.Is(err, errShuttingDown):
		return codes.Unavailable, ReasonShuttingDown, "server is shutting down"
	case errors.Is(err, store.ErrInvalidArgument):
		return codes.InvalidArgument, ReasonInvalidArgument, err.Error()
	case errors.Is(err, store.ErrSessionDead):
		return codes.FailedPrecondition, ReasonSessionDead, "session is dead (unknown, expired, lost or closed)"
	case errors.Is(err, store.ErrNotOwner):
		return codes.PermissionDenied, ReasonNotOwner, "not the current grant of the key (wrong session or stale token)"
	case errors.Is(err, store.ErrNotLeader):
		return codes.Unavailable, ReasonNotLeader, "backend node cannot take writes; retry"
	case errors.Is(err, store.ErrUnavailable):
		return codes.Unavailable, ReasonUnavailable, "backend unavailable; retry"
	case errors.Is(err, store.ErrContention):
		return codes.Unavailable, ReasonContention, "backend contention; retry"
	case errors.Is(err, errLimit):
		return codes.ResourceExhausted, ReasonLimit, err.Error()
	case s.ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		// The store saw the server's own shutdown context end.
		return codes.Unavailable, ReasonShuttingDown, "server is shutting down"
	}
	return codes.Internal, ReasonInternal, "internal error"
}

// toStatus turns an error of an RPC handler into the gRPC status error it
// returns: the one place where errors cross the wire (the SDK's mirror is
// client/errors.go). Unclassified errors are logged and sent as a generic
// Internal error.
func (s *Server) toStatus(ctx context.Context, method string, err error) error {
	if err == nil {
		return nil
	}
	code, reason, msg := s.classify(ctx, err)
	if code == codes.Internal {
		s.log.LogAttrs(context.Background(), slog.LevelError, "rpc failed",
			slog.String("method", method), slog.String("error", err.Error()))
	}
	st := status.New(code, msg)
	if reason == "" {
		return st.Err()
	}
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	var fe *fieldError
	if errors.As(err, &fe) {
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: fe.field, Description: fe.Error()},
		}})
	}
	if withDetails, derr := st.WithDetails(details...); derr == nil {
		st = withDetails
	}
	return st.Err()
}

// sessionError is the per-session error of a KeepAlive reply.
func (s *Server) sessionError(ctx context.Context, err error) *lockdv1.SessionError {
	code, reason, msg := s.classify(ctx, err)
	if code == codes.Internal {
		s.log.LogAttrs(context.Background(), slog.LevelError, "heartbeat failed", slog.String("error", err.Error()))
	}
	return &lockdv1.SessionError{Code: int32(code), Reason: reason, Message: msg}
}

// streamEnd is what the KeepAlive handler returns when its stream ended for
// cause; ctx is the stream's context.
func (s *Server) streamEnd(ctx context.Context, cause error) error {
	switch {
	case errors.Is(cause, io.EOF):
		return nil // the client closed its side
	case errors.Is(cause, errShuttingDown), errors.Is(cause, errLimit):
		return s.toStatus(ctx, "KeepAlive", cause)
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	if _, ok := status.FromError(cause); ok {
		return cause // a transport error of Send or Recv
	}
	return status.Error(codes.Unavailable, "keepalive stream ended")
}
