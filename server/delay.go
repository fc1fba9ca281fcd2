package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// Lock-delay and maximum hold (C2 #ct2-delay): an Acquire's lock_delay_ms
// and max_hold_ms become the grant's store.GrantPolicy, set right after the
// grant and before the reply, so no client learns of a grant whose policy
// the backend does not have.

// policyOf is the grant policy an Acquire asks for.
func policyOf(req *lockdv1.AcquireRequest) store.GrantPolicy {
	return store.GrantPolicy{
		LockDelay: time.Duration(req.LockDelayMs) * time.Millisecond,
		MaxHold:   time.Duration(req.MaxHoldMs) * time.Millisecond,
	}
}

// checkPolicy validates an Acquire's policy against the SPI bounds and this
// server's maxima (lock.server.max-lock-delay, max-hold-limit).
func (s *Server) checkPolicy(req *lockdv1.AcquireRequest) error {
	switch {
	case req.LockDelayMs < 0 || req.LockDelayMs > s.cfg.MaxLockDelay.Milliseconds():
		return invalidf("lock_delay_ms", "%d out of range [0, %d] (lock.server.max-lock-delay)", req.LockDelayMs, s.cfg.MaxLockDelay.Milliseconds())
	case req.MaxHoldMs < 0 || req.MaxHoldMs > s.cfg.MaxHoldLimit.Milliseconds():
		return invalidf("max_hold_ms", "%d out of range [0, %d] (lock.server.max-hold-limit)", req.MaxHoldMs, s.cfg.MaxHoldLimit.Milliseconds())
	case req.MaxHoldMs != 0 && req.MaxHoldMs < store.MinMaxHold.Milliseconds():
		return invalidf("max_hold_ms", "%d is below the smallest maximum hold, %d", req.MaxHoldMs, store.MinMaxHold.Milliseconds())
	}
	if req.Limit > 1 || req.Mode != lockdv1.LockMode_LOCK_MODE_UNSPECIFIED {
		// Semaphore slots and read/write grants have no lock-delay or
		// maximum hold (C2 #ct2-delay): refused, never silently dropped.
		switch {
		case req.LockDelayMs != 0:
			return invalidf("lock_delay_ms", "lock-delay applies to plain exclusive locks only, not with limit or mode")
		case req.MaxHoldMs != 0:
			return invalidf("max_hold_ms", "maximum hold applies to plain exclusive locks only, not with limit or mode")
		}
	}
	return nil
}

// applyPolicy gives the grant g the policy req asks for, if any. If that
// fails the grant is released (best effort: it goes with the session
// otherwise) and the error returned: the caller must not report the grant.
func (s *Server) applyPolicy(ctx context.Context, id store.SessionID, g store.Grant, req *lockdv1.AcquireRequest) error {
	p := policyOf(req)
	if p.IsZero() {
		return nil
	}
	err := s.st.SetGrantPolicy(ctx, id, g.Key, g.Token, p)
	if err == nil {
		return nil
	}
	if !errors.Is(err, store.ErrNotOwner) { // else the grant is gone already
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.st.DeleteIfOwner(rctx, id, g.Key, g.Token)
	}
	s.sess.Untrack(id, g.Key, g.Token)
	if errors.Is(err, store.ErrNotOwner) {
		return fmt.Errorf("%w: the grant ended before its lock-delay or maximum hold was set", store.ErrContention)
	}
	return err
}
