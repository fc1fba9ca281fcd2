package store

import (
	"context"
	"time"

	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// Bounds of a grant policy (C2 #ct2-delay), those of package wirelimits.
const (
	// MaxLockDelay bounds GrantPolicy.LockDelay.
	MaxLockDelay = wirelimits.MaxLockDelay
	// MinMaxHold and MaxMaxHold bound a non-zero GrantPolicy.MaxHold.
	MinMaxHold = wirelimits.MinMaxHold
	MaxMaxHold = wirelimits.MaxMaxHold
)

// GrantPolicy is what a grant may carry besides its value (C2 #ct2-delay).
// The zero value asks for nothing.
type GrantPolicy struct {
	// LockDelay keeps the key from being granted again for this long after
	// the grant ends involuntarily (its session expired or was expired,
	// Revoke, maximum hold). A release (DeleteIfOwner) or CloseSession
	// hands over at once.
	LockDelay time.Duration
	// MaxHold makes the backend revoke the grant once it has been held this
	// long (Watch event EventMaxHold).
	MaxHold time.Duration
}

// IsZero reports whether the policy asks for nothing.
func (p GrantPolicy) IsZero() bool { return p == GrantPolicy{} }

// ValidateGrantPolicy checks a policy: LockDelay 0..MaxLockDelay, MaxHold 0
// or MinMaxHold..MaxMaxHold, both whole milliseconds
// (wirelimits.ValidateLockDelay, then wirelimits.ValidateMaxHold).
func ValidateGrantPolicy(p GrantPolicy) error {
	if err := wirelimits.ValidateLockDelay(p.LockDelay); err != nil {
		return err
	}
	return wirelimits.ValidateMaxHold(p.MaxHold)
}

// GrantPolicySetter gives a grant its lock-delay and maximum hold (C2
// #ct2-delay). Like ValueSetter it is a part of LockStore of its own, so the
// grant paths and their fencing tokens stay as they are: the server calls
// SetGrantPolicy right after a grant whose Acquire asked for a policy, and
// before it answers.
type GrantPolicySetter interface {
	// SetGrantPolicy records p (ValidateGrantPolicy) for the grant
	// (session, key, token), replacing an earlier policy of it. It is
	// ErrNotOwner unless that exact grant is the current one. The maximum
	// hold counts from this call.
	SetGrantPolicy(ctx context.Context, id SessionID, key string, token uint64, p GrantPolicy) error
}
