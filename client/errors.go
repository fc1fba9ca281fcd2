package client

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// Sentinel errors of the SDK. Every error the SDK returns for one of these
// conditions matches the sentinel with errors.Is. When the caller's context
// ends, the error also matches ctx.Err().
var (
	// ErrInvalidArgument: the request is wrong (bad key, TTL, wait timeout,
	// page token). The message names the field.
	ErrInvalidArgument = errors.New("client: invalid argument")

	// ErrSessionDead: the server reports the session unknown, expired, lost
	// or closed. Terminal.
	ErrSessionDead = errors.New("client: session dead")

	// ErrSessionExpired: the session's local deadline (send time +
	// Remaining − safety margin) passed without a fresh acknowledgement,
	// e.g. while the server was unreachable. The session may still exist on
	// the server, but the client no longer trusts it. It matches
	// ErrSessionDead too.
	ErrSessionExpired error = sessionExpiredError{}

	// ErrNotOwner: a release named a grant that is not the key's current
	// one: the lock was lost (revoked, expired) before the release.
	ErrNotOwner = errors.New("client: not owner")

	// ErrLimitMismatch: an Acquire's WithLimit, Shared or Exclusive
	// disagrees with the kind of lock the key's holders and waiters use (a
	// semaphore of another N, a read/write request on a plain lock or the
	// reverse). Nothing was written. Not retried.
	ErrLimitMismatch = errors.New("client: limit mismatch")

	// ErrLocked: TryAcquire found the key held by another session (or
	// waiters queued for it).
	ErrLocked = errors.New("client: locked by another session")

	// ErrUnavailable: the server or its backend is unreachable or busy.
	// Retryable: the SDK retries it with backoff and returns it only when
	// the caller's context ends (wrapped together with ctx.Err()).
	ErrUnavailable = errors.New("client: unavailable")

	// ErrWaitTimeout: Acquire's WithWaitTimeout ran out before the lock was
	// granted.
	ErrWaitTimeout = errors.New("client: wait timeout")

	// ErrLockLost: the server told the holder its lock is gone (an
	// administrator revoked it, or it expired with its session).
	ErrLockLost = errors.New("client: lock lost")

	// ErrMaxHold: the lock was held longer than its WithMaxHold and the
	// server revoked it (Lock.Err). It matches ErrLockLost too.
	ErrMaxHold error = maxHoldError{}

	// ErrReleased: the lock was released by Lock.Release (Lock.Err after a
	// release).
	ErrReleased = errors.New("client: lock released")

	// ErrClosed: the session or client was closed by its owner.
	ErrClosed = errors.New("client: closed")

	// ErrLimit: a server limit was reached (see the server package doc).
	ErrLimit = errors.New("client: server limit reached")

	// ErrPermissionDenied: the server refused the call for want of
	// authority: a session secret that does not match the session (C2
	// #ct2-ownership; with this SDK that means a session the server cannot
	// verify, such as one opened through an older lockd; terminal for the
	// session), no access rule allowing the call on that key (C5
	// #ct5-auth, reason ACCESS_DENIED), or credentials the server does not
	// accept (UNAUTHENTICATED). The message says why.
	ErrPermissionDenied = errors.New("client: permission denied")

	// ErrUnauthenticated: the server did not accept the caller's
	// credentials (UNAUTHENTICATED, HTTP 401): an unknown bearer token, or a
	// certificate and a token naming different principals (C5 #ct5-auth).
	// It matches ErrPermissionDenied too.
	ErrUnauthenticated error = unauthenticatedError{}

	// ErrInternal: the server failed unexpectedly; details are in its log.
	ErrInternal = errors.New("client: internal server error")

	// ErrDeadlock: Acquire's wait was refused because it closed a cycle of
	// waiting sessions (C2 #ct2-deadlock: this session holds a key another
	// waiting session waits for, which holds ... the key this one waits
	// for). The place in the queue is gone; the session keeps its other
	// locks: release one and try again, or give up. Never retried. The
	// error is a *DeadlockError naming the cycle's keys.
	ErrDeadlock = errors.New("client: deadlock")
)

// DeadlockError is the ErrDeadlock of one refused Acquire (DEADLOCK on the
// wire): Keys are the keys of the cycle's waits, sorted, this Acquire's
// among them.
type DeadlockError struct {
	Keys []string
	msg  string
}

func (e *DeadlockError) Error() string {
	if e.msg == "" {
		return ErrDeadlock.Error()
	}
	return ErrDeadlock.Error() + ": " + e.msg
}

// Is makes errors.Is(err, ErrDeadlock) hold.
func (e *DeadlockError) Is(target error) bool { return target == ErrDeadlock }

type unauthenticatedError struct{}

func (unauthenticatedError) Error() string        { return "client: unauthenticated" }
func (unauthenticatedError) Is(target error) bool { return target == ErrPermissionDenied }

type maxHoldError struct{}

func (maxHoldError) Error() string        { return "client: lock held longer than its maximum hold" }
func (maxHoldError) Is(target error) bool { return target == ErrLockLost }

type sessionExpiredError struct{}

func (sessionExpiredError) Error() string {
	return "client: session expired (deadline passed without acknowledgement)"
}
func (sessionExpiredError) Is(target error) bool { return target == ErrSessionDead }

// fromStatus maps an error returned by a gRPC call to the SDK's sentinels:
// the one place where codes map back, in the vocabulary of
// lock.dev/lockd/proto/lockd/v1/wireerr (the server's side is
// server/errors.go). ctx is the call's context: when it
// has ended the result also matches ctx.Err().
func fromStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		}
		return err
	}
	var mapped error
	if v, ok := wireerr.FieldViolation(st); ok && st.Code() == codes.InvalidArgument {
		mapped = invalidField(v.Field, v.Description)
	} else if keys, ok := wireerr.DeadlockKeys(st); ok && st.Code() == codes.Aborted {
		mapped = &DeadlockError{Keys: keys, msg: st.Message()}
	} else {
		mapped = mapCode(st.Code(), wireerr.Reason(st), st.Message())
	}
	if ctx.Err() != nil && !errors.Is(mapped, ctx.Err()) {
		return fmt.Errorf("%w: %w", ctx.Err(), mapped)
	}
	return mapped
}

// fromSessionError maps the per-session error of a KeepAlive reply.
func fromSessionError(e *lockdv1.SessionError) error {
	return mapCode(codes.Code(e.Code), e.Reason, e.Message)
}

func mapCode(code codes.Code, reason, msg string) error {
	var sentinel error
	switch code {
	case codes.InvalidArgument:
		sentinel = ErrInvalidArgument
		if reason == wireerr.ReasonLimitMismatch {
			sentinel = ErrLimitMismatch
		}
	case codes.FailedPrecondition:
		sentinel = ErrSessionDead
	case codes.PermissionDenied:
		// NOT_OWNER (and a reason-less answer of an older server) is a
		// release of a grant that is gone; every other reason is a
		// refusal.
		sentinel = ErrNotOwner
		if reason != "" && reason != wireerr.ReasonNotOwner {
			sentinel = ErrPermissionDenied
		}
	case codes.Unavailable, codes.Aborted:
		sentinel = ErrUnavailable
		if reason == wireerr.ReasonDeadlock {
			sentinel = ErrDeadlock // never retried (C2 #ct2-deadlock)
		}
	case codes.DeadlineExceeded:
		if reason == wireerr.ReasonWaitTimeout {
			sentinel = ErrWaitTimeout
		} else {
			sentinel = context.DeadlineExceeded
		}
	case codes.Canceled:
		sentinel = context.Canceled
	case codes.ResourceExhausted:
		sentinel = ErrLimit
	case codes.Unauthenticated:
		sentinel = ErrUnauthenticated
	default:
		sentinel = ErrInternal
	}
	if msg == "" {
		return sentinel
	}
	return fmt.Errorf("%w: %s", sentinel, msg)
}

// invalidField is ErrInvalidArgument about a request field: the server's
// field violations and the SDK's own checks read alike,
// "client: invalid argument: <field>: <problem>".
func invalidField(field, problem string) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidArgument, field, problem)
}

// invalidInput names the request field the error of a wirelimits check (a
// *wirelimits.InvalidError) is about. A nil err stays nil.
func invalidInput(field string, err error) error {
	if err == nil {
		return nil
	}
	if ie, ok := errors.AsType[*wirelimits.InvalidError](err); ok {
		return invalidField(field, ie.Problem)
	}
	return fmt.Errorf("%w: %s: %w", ErrInvalidArgument, field, err)
}

// retryable reports whether the SDK retries err.
func retryable(err error) bool { return errors.Is(err, ErrUnavailable) }
