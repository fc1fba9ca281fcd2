package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// Server-side error conditions that are not store sentinels.
var (
	errWaitTimeout  = errors.New("server: wait timeout")
	errShuttingDown = errors.New("server: shutting down")
	errLimit        = errors.New("server: limit reached")
)

// fieldError is invalid input: the request field it is about and what is
// wrong with it, kept apart so they cross the wire as data
// (wireerr.Violation).
type fieldError struct {
	field   string
	problem string
	err     error // wraps store.ErrInvalidArgument
}

func (e *fieldError) Error() string { return e.violation().Message() }
func (e *fieldError) Unwrap() error { return e.err }

func (e *fieldError) violation() wireerr.Violation {
	return wireerr.Violation{Field: e.field, Description: e.problem}
}

// invalid names the request field a validation error of the store package
// (a *store.InvalidError) is about. A nil err stays nil.
func invalid(field string, err error) error {
	if err == nil {
		return nil
	}
	problem := err.Error()
	if ie, ok := errors.AsType[*store.InvalidError](err); ok {
		problem = ie.Problem
	}
	return &fieldError{field: field, problem: problem, err: err}
}

// invalidf is invalid input of the request field field; the format says what
// is wrong.
func invalidf(field, format string, args ...any) error {
	return &fieldError{field: field, problem: fmt.Sprintf(format, args...), err: store.ErrInvalidArgument}
}

// classified is an error as it crosses the wire: classify's answer.
type classified struct {
	code        codes.Code
	reason, msg string
	// cycle: the error is a *store.DeadlockError; shown: its keys the caller
	// may read, filtered once (the policy may be reloaded at any time) and
	// named by both msg and the status details.
	cycle bool
	shown []string
}

// classify maps an error to the gRPC code and wireerr reason it crosses the
// wire with, and the message. ctx is the RPC's context: when it has ended,
// the error is the caller's own cancellation or deadline whatever the store
// said (no reason then).
func (s *Server) classify(ctx context.Context, err error) classified {
	if d, ok := errors.AsType[*deniedError](err); ok {
		return classified{code: wireerr.Code(d.reason), reason: d.reason, msg: d.msg} // a refusal (secret.go)
	}
	var reason, msg string
	var shown []string // a DEADLOCK's keys the caller may read
	cycle := false
	switch {
	case errors.Is(err, errWaitTimeout):
		reason, msg = wireerr.ReasonWaitTimeout, "wait timeout exceeded"
	case ctx.Err() != nil:
		st := status.FromContextError(ctx.Err())
		return classified{code: st.Code(), msg: st.Message()}
	case errors.Is(err, errShuttingDown):
		reason, msg = wireerr.ReasonShuttingDown, "server is shutting down"
	case errors.Is(err, store.ErrInvalidArgument):
		reason, msg = wireerr.ReasonInvalidArgument, err.Error()
	case errors.Is(err, store.ErrSessionDead):
		reason, msg = wireerr.ReasonSessionDead, "session is dead (unknown, expired, lost or closed)"
	case errors.Is(err, store.ErrLimitMismatch):
		reason, msg = wireerr.ReasonLimitMismatch, "the key is held or awaited as another kind of lock: its holders and waiters use another limit or mode (C2 #ct2-multi)"
	case errors.Is(err, store.ErrDeadlock):
		reason, msg = wireerr.ReasonDeadlock, "deadlock: the wait closes a cycle of waiting sessions (C2 #ct2-deadlock)"
		if de, ok := errors.AsType[*store.DeadlockError](err); ok {
			var withheld int
			cycle = true
			shown, withheld = readable(ctx, de.Keys) // only the keys the caller may read
			msg = deadlockMessage(shown, withheld)
		}
	case errors.Is(err, store.ErrNotOwner):
		reason, msg = wireerr.ReasonNotOwner, "not the current grant of the key (wrong session or stale token)"
	case errors.Is(err, store.ErrNotLeader):
		reason, msg = wireerr.ReasonNotLeader, "backend node cannot take writes; retry"
	case errors.Is(err, store.ErrUnavailable):
		reason, msg = wireerr.ReasonUnavailable, "backend unavailable; retry"
	case errors.Is(err, store.ErrContention):
		reason, msg = wireerr.ReasonContention, "backend contention; retry"
	case errors.Is(err, errLimit):
		reason, msg = wireerr.ReasonLimit, err.Error()
	case s.ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		// The store saw the server's own shutdown context end.
		reason, msg = wireerr.ReasonShuttingDown, "server is shutting down"
	default:
		reason, msg = wireerr.ReasonInternal, "internal error"
	}
	return classified{code: wireerr.Code(reason), reason: reason, msg: msg, cycle: cycle, shown: shown}
}

// toStatus turns an error of an RPC handler into the gRPC status error it
// returns: the one place where errors cross the wire (the SDK's mirror is
// client/errors.go). Unclassified errors are logged and sent as a generic
// Internal error.
func (s *Server) toStatus(ctx context.Context, method string, err error) error {
	if err == nil {
		return nil
	}
	if d, ok := errors.AsType[*deniedError](err); ok && d.limit != "" {
		return wireerr.LimitStatus(d.limit, d.msg).Err()
	}
	c := s.classify(ctx, err)
	code, reason, msg := c.code, c.reason, c.msg
	if c.cycle && reason == wireerr.ReasonDeadlock {
		return wireerr.DeadlockStatus(c.shown, msg).Err() // the keys msg names, no other
	}
	if code == codes.Internal {
		s.log.LogAttrs(context.Background(), slog.LevelError, telemetry.EventRPCFailed,
			slog.String("method", method), slog.String("error", err.Error()))
	}
	if reason == "" {
		return status.Error(code, msg)
	}
	var v *wireerr.Violation
	if fe, ok := errors.AsType[*fieldError](err); ok {
		v = new(fe.violation())
	}
	return wireerr.Status(reason, msg, v).Err()
}

// sessionError is the per-session error of a KeepAlive reply.
func (s *Server) sessionError(ctx context.Context, err error) *lockdv1.SessionError {
	c := s.classify(ctx, err)
	if c.code == codes.Internal {
		s.log.LogAttrs(context.Background(), slog.LevelError, telemetry.EventHeartbeatFailed, slog.String("error", err.Error()))
	}
	return &lockdv1.SessionError{Code: int32(c.code), Reason: c.reason, Message: c.msg}
}

// streamEnd is what the KeepAlive handler returns when its stream ended for
// cause; ctx is the stream's context.
func (s *Server) streamEnd(ctx context.Context, cause error) error {
	switch {
	case errors.Is(cause, io.EOF):
		return nil // the client closed its side
	case errors.Is(cause, errShuttingDown), errors.Is(cause, errLimit):
		return s.toStatus(ctx, "KeepAlive", cause)
	case errors.Is(cause, errNoLiveSession):
		return wireerr.Status(wireerr.ReasonSessionDead, cause.Error(), nil).Err()
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	if _, ok := status.FromError(cause); ok {
		return cause // a transport error of Send or Recv
	}
	return status.Error(codes.Unavailable, "keepalive stream ended")
}
