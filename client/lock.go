package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// Lock is a granted lock. It is trusted until Done closes.
type Lock struct {
	s     *Session
	key   string
	token uint64
	seq   uint64 // Session.lockSeq when added
	// deadline (Session.mu) is when the lock stops being trusted unless an
	// answer that confirms it extends it; never after the session's.
	deadline time.Time
	// maxHoldAt is the send time of the Acquire that granted the lock plus
	// its maximum hold (zero: none): a lock no answer confirms from then on
	// ends with ErrMaxHold (C2 #ct2-maxhold-sdk). Set when the Lock is made,
	// never changed.
	maxHoldAt time.Time
	done      chan struct{}
	ctx       context.Context
	cancel    context.CancelCauseFunc

	mu         sync.Mutex
	err        error
	ambiguous  bool // a release attempt may have taken effect
	releasedOK bool
}

// Key returns the lock's key.
func (l *Lock) Key() string { return l.key }

// Token returns the fencing token of the grant: strictly increasing over
// successive grants of the key. Pass it to the resource the lock protects
// and have the resource reject tokens lower than the highest it has seen.
func (l *Lock) Token() uint64 { return l.token }

// Done is closed when the lock can no longer be trusted: its session's
// deadline passed or the session ended, the server reported the lock
// revoked or expired, a heartbeat answer no longer listed it or none listed
// it before its own deadline (Deadline), or it was released.
func (l *Lock) Done() <-chan struct{} { return l.done }

// Context returns a context that is cancelled when Done closes; its cause
// (context.Cause) is Err.
func (l *Lock) Context() context.Context { return l.ctx }

// Deadline returns the instant (on the client's clock) at which the lock
// stops being trusted unless a newer answer that confirms it extends it:
// the earlier of its own deadline (its grant reply, or the latest heartbeat
// answer that listed it) and its session's (C2 #ct2-confirm).
func (l *Lock) Deadline() time.Time {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.deadline.Before(l.deadline) {
		return l.s.deadline
	}
	return l.deadline
}

// Err is nil while the lock is trusted; afterwards it says why not
// (ErrReleased, ErrLockLost, or the session's error).
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *Lock) end(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = err
	close(l.done)
	l.cancel(err)
}

// SetValue replaces the value attached to the grant (see WithValue): the
// grant and its fencing token do not change, and watchers made WithHolders
// see an EventValue. It is ErrLockLost once the lock is no longer trusted
// (Done closed) and ErrNotOwner when the server finds the grant gone; it
// never takes the lock again. Retryable errors are retried until ctx ends
// (setting the same value twice is harmless).
func (l *Lock) SetValue(ctx context.Context, value []byte) error {
	if err := invalidInput("value", wirelimits.ValidateValue(value)); err != nil {
		return fmt.Errorf("set value of %q: %w", l.key, err)
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("set value of %q: %w", l.key, lostErr(err))
	}
	err := l.s.c.retry(ctx, func(ctx context.Context) error {
		_, err := l.s.c.api.SetValue(ctx, &lockdv1.SetValueRequest{SessionId: l.s.id, SessionSecret: l.s.secret,
			Key: l.key, Token: l.token, Value: value})
		return fromStatus(ctx, err)
	})
	if err != nil {
		return fmt.Errorf("set value of %q: %w", l.key, err)
	}
	return nil
}

// lostErr makes a lock's end error match ErrLockLost (a session's end or a
// release does not by itself).
func lostErr(err error) error {
	if errors.Is(err, ErrLockLost) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrLockLost, err)
}

// Release releases the lock. It stops trusting the lock first (Done
// closes), then deletes the grant on the server, checked by fencing token so
// it never deletes a newer grant. It is safe to retry: when an earlier
// attempt may have taken effect (its reply was lost) and a retry finds the
// grant gone, Release returns nil — unless the lock had already been lost
// when Release was called (Done closed with a loss): then the grant may have
// gone with the loss, not with the release, and Release says ErrNotOwner.
// ErrNotOwner from a first attempt means the lock was lost before the
// release.
func (l *Lock) Release(ctx context.Context) error {
	lostBefore := l.Err() // nil while trusted; a loss if it ended before this call
	if errors.Is(lostBefore, ErrReleased) {
		lostBefore = nil // an earlier Release call, not a loss
	}
	defer l.s.busyKey(l.key)()
	l.s.mu.Lock()
	if l.s.locks[l.key] == l {
		delete(l.s.locks, l.key)
	}
	l.s.mu.Unlock()
	l.end(ErrReleased)

	l.mu.Lock()
	if l.releasedOK {
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	err := l.s.c.retry(ctx, func(ctx context.Context) error {
		_, err := l.s.c.api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: l.s.id, SessionSecret: l.s.secret, Key: l.key, Token: l.token})
		err = fromStatus(ctx, err)
		l.mu.Lock()
		defer l.mu.Unlock()
		switch {
		case err == nil:
			l.releasedOK = true
		case errors.Is(err, ErrNotOwner) && l.ambiguous && lostBefore != nil:
			return fmt.Errorf("%w (the lock was lost before the release: %v)", err, lostBefore)
		case errors.Is(err, ErrNotOwner) && l.ambiguous:
			l.releasedOK = true
			return nil
		case retryable(err) || ctx.Err() != nil:
			l.ambiguous = true
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("release %q: %w", l.key, err)
	}
	return nil
}
