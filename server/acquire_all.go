package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/server/internal/sessions"
	"lock.dev/lockd/store"
)

// acquireAll answers an Acquire with keys (C2 #ct2-acquire-all): every key
// granted, or none. Access control has allowed lock on every key (auth.go).
// Each key is admitted like a one-key Acquire (max-locks-per-session, and
// with wait max-waiters and max-waiters-per-key) before the store is asked,
// and each grant is tracked like one.
func (s service) acquireAll(ctx context.Context, req *lockdv1.AcquireRequest) (*lockdv1.AcquireResponse, error) {
	recv := time.Now()
	id := store.SessionID(req.SessionId)
	r, err := s.beginAcquire(ctx, id, req.SessionSecret, s.checkAcquireAll(req)) // service.go
	if err != nil {
		return nil, s.toStatus(ctx, "Acquire", err)
	}
	defer s.endAcquire(r)
	mark := s.sess.CloseMark(r)
	slots := make([]*acquireSlot, 0, len(req.Keys))
	defer func() {
		for _, a := range slots {
			a.release()
		}
	}()
	for _, k := range req.Keys {
		a, err := s.admitAcquire(r, k, req.Wait) // limits.go
		if err != nil {
			return nil, err
		}
		slots = append(slots, a)
	}

	var (
		gs      []store.Grant
		granted bool
		opts    []store.AcquireOption
	)
	if req.NoDeadlockCheck {
		opts = append(opts, store.NoDeadlockCheck()) // C2 #ct2-acquire-all
	}
	if req.Wait {
		wctx, done := s.waitContext(ctx, req.WaitTimeoutMs)
		gs, granted, err = s.st.AcquireAll(wctx, id, req.Keys, true, opts...)
		err = done(err)
	} else {
		gs, granted, err = s.st.AcquireAll(ctx, id, req.Keys, false, opts...)
	}
	switch {
	case err != nil:
		if errors.Is(err, store.ErrSessionDead) {
			s.sess.MarkGone(r)
		}
		return nil, s.toStatus(ctx, "Acquire", fmt.Errorf("acquire: %w", err))
	case !granted:
		return &lockdv1.AcquireResponse{}, nil
	}
	waited := time.Since(recv)
	resp := &lockdv1.AcquireResponse{Granted: true, Grants: make([]*lockdv1.HeldLock, len(gs))}
	for i, g := range gs {
		switch s.sess.Grant(r, mark, recv, g, slots[i].slot) {
		case sessions.Granted:
			s.stats.Waited(s.stats.Template(g.Key), waited)
		case sessions.GrantOverlapped:
			// Retryable: a retry returns the same grants (held already).
			return nil, s.toStatus(ctx, "Acquire", fmt.Errorf("acquire: %w", errCloseOverlap))
		case sessions.GrantEnding:
			return nil, s.toStatus(ctx, "Acquire", fmt.Errorf("acquire: %w", store.ErrSessionDead))
		}
		resp.Grants[i] = &lockdv1.HeldLock{Key: g.Key, Token: g.Token}
		resp.RemainingMs = max(g.Remaining, 0).Milliseconds()
	}
	return resp, nil
}

// checkAcquireAll validates an Acquire with keys: plain locks only, none of
// the one-key fields (C2 #ct2-acquire-all).
func (s *Server) checkAcquireAll(req *lockdv1.AcquireRequest) error {
	if err := store.ValidateSessionID(store.SessionID(req.SessionId)); err != nil {
		return invalid("session_id", err)
	}
	if err := store.ValidateKeys(req.Keys); err != nil {
		return invalid("keys", err)
	}
	const with = "must be unset with keys (several keys are plain locks only)"
	switch {
	case req.Key != "":
		return invalidf("key", "must be empty with keys")
	case req.Limit > 1:
		return invalidf("limit", with)
	case req.Mode != lockdv1.LockMode_LOCK_MODE_UNSPECIFIED:
		return invalidf("mode", with)
	case req.KeepPlace:
		return invalidf("keep_place", with)
	case len(req.Value) > 0:
		return invalidf("value", with)
	case req.LockDelayMs != 0:
		return invalidf("lock_delay_ms", with)
	case req.MaxHoldMs != 0:
		return invalidf("max_hold_ms", with)
	case req.WaitTimeoutMs < 0 || req.WaitTimeoutMs > MaxWait.Milliseconds():
		return invalidf("wait_timeout_ms", "%d out of range [0, %d]", req.WaitTimeoutMs, MaxWait.Milliseconds())
	case !req.Wait && req.WaitTimeoutMs != 0:
		return invalidf("wait_timeout_ms", "must be 0 when wait is false")
	}
	return nil
}

// waitContext is the context of a waiting acquire: ctx bounded by the wait
// timeout (the server's maximum wait when 0) and ended by Shutdown. done
// turns the store's context error into the cause (errWaitTimeout,
// errShuttingDown) when the caller's own ctx is still alive, and releases
// the context.
func (s *Server) waitContext(ctx context.Context, timeoutMs int64) (context.Context, func(error) error) {
	timeout := time.Duration(s.maxWait.Load())
	if timeoutMs > 0 {
		timeout = time.Duration(timeoutMs) * time.Millisecond
	}
	wctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.ctx, func() { cancel(errShuttingDown) })
	wctx, cancelTimeout := context.WithTimeoutCause(wctx, timeout, errWaitTimeout)
	return wctx, func(err error) error {
		if err != nil && wctx.Err() != nil && ctx.Err() == nil &&
			(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			err = fmt.Errorf("%w: %w", context.Cause(wctx), err)
		}
		cancelTimeout()
		stop()
		cancel(nil)
		return err
	}
}
