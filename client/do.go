package client

import (
	"context"
	"errors"
	"fmt"
)

// Do runs fn while holding the lock named key: it opens a session on c,
// acquires key (waiting in its FIFO queue; opts as for Acquire), runs fn
// under a context that is cancelled when ctx ends or the lock is lost, then
// releases the lock and closes the session.
//
// fn must stop using the protected resource when its context is cancelled,
// and should pass the fencing token (TokenFromContext) to the resource.
// Do returns fn's error; if the lock was lost while fn ran, the error also
// matches ErrLockLost or the session's error; a failed release is joined
// in.
func Do(ctx context.Context, c *Client, key string, fn func(ctx context.Context) error, opts ...AcquireOption) (err error) {
	s, err := c.NewSession(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultCloseTimeout)
		defer cancel()
		if cerr := s.Close(cctx); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	l, err := s.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(context.WithValue(ctx, tokenKey{}, l.Token()))
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	ferr := fn(fctx)
	stop()
	cancel(nil)

	if lost := l.Err(); lost != nil {
		return errors.Join(ferr, fmt.Errorf("lock %q lost while fn ran: %w", key, lost))
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultCloseTimeout)
	defer rcancel()
	return errors.Join(ferr, l.Release(rctx))
}

type tokenKey struct{}

// TokenFromContext returns the fencing token of the lock Do holds while fn
// runs, and false outside Do.
func TokenFromContext(ctx context.Context) (uint64, bool) {
	t, ok := ctx.Value(tokenKey{}).(uint64)
	return t, ok
}
