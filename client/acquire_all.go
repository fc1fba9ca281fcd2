package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// AcquireAll takes every lock of keys at once, or none (C2
// #ct2-acquire-all): one Acquire call with all the keys, which the server
// takes in ascending key order, each waiting in its FIFO queue, so two
// sessions asking for overlapping keys in different orders never deadlock.
// It returns one Lock per key, in the order of keys, each with its key's
// own fencing token; or an error, and then the session holds none of the
// keys it did not hold before. It waits like Acquire: until ctx ends, the
// wait timeout (WithWaitTimeout, for the whole set) runs out
// (ErrWaitTimeout), or the session ends; retryable errors are retried (a
// retry starts the wait again: no place is kept). 1 to 64 distinct keys,
// plain locks only: of the options only WithWaitTimeout and
// WithoutDeadlockCheck apply, any other is ErrInvalidArgument, and the
// session's lock-delay is not applied. Release the locks with ReleaseAll.
func (s *Session) AcquireAll(ctx context.Context, keys []string, opts ...AcquireOption) ([]*Lock, error) {
	ao, err := acquireAllOpts(opts)
	if err != nil {
		return nil, fmt.Errorf("acquire all %q: %w", keys, err)
	}
	req := &lockdv1.AcquireRequest{SessionId: s.id, SessionSecret: s.secret, Keys: keys, Wait: true, NoDeadlockCheck: ao.noDeadlock}
	if ao.waitTimeout > 0 {
		req.WaitTimeoutMs = int64((ao.waitTimeout + time.Millisecond - 1) / time.Millisecond)
	}
	ls, err := s.acquireAll(ctx, req, ao.waitTimeout == 0)
	if err != nil {
		return nil, fmt.Errorf("acquire all %q: %w", keys, err)
	}
	return ls, nil
}

// TryAcquireAll takes every lock of keys if each is free and nobody waits
// for it; otherwise it returns ErrLocked at once and holds none of them
// (C2 #ct2-acquire-all). Keys as AcquireAll.
func (s *Session) TryAcquireAll(ctx context.Context, keys []string) ([]*Lock, error) {
	req := &lockdv1.AcquireRequest{SessionId: s.id, SessionSecret: s.secret, Keys: keys}
	ls, err := s.acquireAll(ctx, req, false)
	if err != nil {
		return nil, fmt.Errorf("try acquire all %q: %w", keys, err)
	}
	return ls, nil
}

// ReleaseAll releases every lock (Lock.Release each, in order) and returns
// the errors joined, nil when all were released.
func ReleaseAll(ctx context.Context, locks []*Lock) error {
	var errs []error
	for _, l := range locks {
		if l == nil {
			continue
		}
		if err := l.Release(ctx); err != nil {
			errs = append(errs, fmt.Errorf("release %q: %w", l.Key(), err))
		}
	}
	return errors.Join(errs...)
}

// acquireAllOpts applies the options of AcquireAll: only the wait timeout
// and the deadlock opt-out apply to several keys.
func acquireAllOpts(opts []AcquireOption) (acquireOptions, error) {
	var ao acquireOptions
	for _, opt := range opts {
		opt(&ao)
	}
	switch {
	case ao.waitTimeout < 0:
		return ao, fmt.Errorf("%w: wait timeout: negative", ErrInvalidArgument)
	case ao.multi():
		return ao, fmt.Errorf("%w: several keys are plain locks only: not with WithLimit, Shared or Exclusive", ErrInvalidArgument)
	case ao.updates != nil:
		return ao, fmt.Errorf("%w: WithWaitUpdates does not apply to several keys (no single queue position)", ErrInvalidArgument)
	case ao.value != nil || ao.lockDelaySet || ao.maxHold != 0:
		return ao, fmt.Errorf("%w: WithValue, WithLockDelay and WithMaxHold do not apply to several keys", ErrInvalidArgument)
	}
	return ao, nil
}

// acquireAll sends req (with keys) until it is answered and records the
// grants. A grant it cannot record (the session ended, or a lock was lost
// before the reply arrived) fails the call and the others are released.
func (s *Session) acquireAll(ctx context.Context, req *lockdv1.AcquireRequest, untilCtx bool) ([]*Lock, error) {
	if err := invalidInput("keys", wirelimits.ValidateKeys(req.Keys)); err != nil {
		return nil, err
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	for _, k := range req.Keys {
		defer s.busyKey(k)()
		// A leave of a key's queue still under way (an earlier Acquire's)
		// ends first.
		s.mu.Lock()
		pending := s.leaving[k]
		delete(s.leaving, k)
		s.mu.Unlock()
		pending.stop()
	}
	resp, sent, err := s.send(ctx, req, untilCtx)
	if err != nil {
		return nil, err
	}
	if !resp.GetGranted() {
		return nil, ErrLocked
	}
	d := s.extend(sent, ms(resp.GetRemainingMs()))
	gs := resp.GetGrants()
	if len(gs) != len(req.Keys) {
		return nil, fmt.Errorf("%w: the server answered %d grants for %d keys", ErrUnavailable, len(gs), len(req.Keys))
	}
	ls := make([]*Lock, 0, len(gs))
	var fresh []*Lock // the Locks this call made (not a Lock the session had)
	for i, g := range gs {
		s.mu.Lock()
		had := s.locks[req.Keys[i]]
		s.mu.Unlock()
		l, err := s.addLock(req.Keys[i], g.GetToken(), d, time.Time{})
		if err == nil && g.GetKey() != req.Keys[i] {
			err = fmt.Errorf("%w: grant %d names %q, not %q", ErrUnavailable, i, g.GetKey(), req.Keys[i])
		}
		if err != nil {
			// All or none: give back what this call was granted. A
			// failure leaves it to the session's end.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = ReleaseAll(rctx, fresh)
			for _, g := range gs[i:] {
				s.mu.Lock()
				l := s.locks[g.GetKey()]
				s.mu.Unlock()
				if l == nil || l.token != g.GetToken() {
					_, _ = s.c.api.Release(rctx, &lockdv1.ReleaseRequest{SessionId: s.id, SessionSecret: s.secret, Key: g.GetKey(), Token: g.GetToken()})
				}
			}
			return nil, err
		}
		if l != had {
			fresh = append(fresh, l)
		}
		ls = append(ls, l)
	}
	return ls, nil
}
