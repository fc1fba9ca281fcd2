package store

import (
	"errors"
	"fmt"

	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// Sentinel errors of the SPI (C2 #ct2-errors). Backends classify driver
// errors into these once, at the backend boundary, and wrap them with %w and
// a short operation phrase, so errors.Is works on every return value.
var (
	// ErrInvalidArgument: the request itself is wrong (bad key, TTL out of
	// range, bad limit). Nothing was written. Not retryable. It is
	// wirelimits.ErrInvalidArgument, the sentinel of the wire's checks.
	ErrInvalidArgument = wirelimits.ErrInvalidArgument

	// ErrSessionDead: the session is unknown, expired, lost or closed. It is
	// terminal: a session reported dead is never reported live again, and
	// this error is never retryable.
	ErrSessionDead = errors.New("store: session dead")

	// ErrNotOwner: a release named a grant (session, key, token) that is not
	// the key's current grant. Nothing was changed.
	ErrNotOwner = errors.New("store: not owner")

	// ErrContention: a transient condition (serialization failure, deadlock,
	// a backend that is briefly unreachable or overloaded). The operation did
	// not take effect, or took effect in a way a retry detects; retry it.
	ErrContention = errors.New("store: contention")

	// ErrNotLeader: the backend node answering is not the one that can take
	// writes (etcd without a leader, a PostgreSQL read-only standby). Retry,
	// possibly elsewhere.
	ErrNotLeader = errors.New("store: not leader")

	// ErrUnavailable: the backend could not be reached (connection refused
	// or lost, request timed out). It is a refinement of ErrContention, not
	// a third retryable class: errors.Is(ErrUnavailable, ErrContention) is
	// true. It exists so logs and metrics can tell an outage from a conflict.
	ErrUnavailable error = unavailableError{}

	// ErrLimitMismatch: an acquire's kind (plain lock, semaphore of N,
	// read/write lock) differs from that of the key's current holders and
	// waiters (C2 #ct2-multi). Nothing was written. Not retryable.
	ErrLimitMismatch = errors.New("store: limit mismatch")
)

// InvalidError is an ErrInvalidArgument that says what is wrong as data
// (e.g. "key is empty"), so the server and the SDK can name the request field
// without editing error text. The validation functions of this package
// return it. It is wirelimits.InvalidError (an alias), so errors.As with
// either name matches the errors of both packages.
type InvalidError = wirelimits.InvalidError

func invalidf(format string, args ...any) error {
	return &InvalidError{Problem: fmt.Sprintf(format, args...)}
}

type unavailableError struct{}

func (unavailableError) Error() string        { return "store: backend unavailable" }
func (unavailableError) Is(target error) bool { return target == ErrContention }

// IsRetryable reports whether err is one of the retryable sentinels
// (ErrContention, ErrNotLeader; ErrUnavailable is a kind of ErrContention).
// A dead session is never retryable. Backends return the caller's own
// context error (cancelled, deadline exceeded) unclassified, so it is not
// retryable either; a driver timeout while the caller's context is still
// alive is classified as ErrUnavailable and is.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, ErrSessionDead) {
		return false
	}
	return errors.Is(err, ErrContention) || errors.Is(err, ErrNotLeader)
}
