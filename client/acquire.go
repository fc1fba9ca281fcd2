package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// Acquire takes the lock named key, waiting in the key's FIFO queue until it
// is granted, ctx ends, the wait timeout (WithWaitTimeout) runs out
// (ErrWaitTimeout), or the session ends. Retryable errors are retried, and
// a wait longer than the server's maximum wait is sent again; the session
// keeps its place in the queue across them, also when the retry goes to
// another replica (C2 #ct2-keep-place). When Acquire returns without a
// grant the place is given up (LeaveQueue, retried in the background while
// the session lives). Asking again for a key the session holds returns the
// same Lock.
func (s *Session) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	ao, err := acquireOpts(opts)
	if err != nil {
		return nil, fmt.Errorf("acquire %q: %w", key, err)
	}
	if ao.waitTimeout < 0 {
		return nil, fmt.Errorf("acquire %q: %w: wait timeout: negative", key, ErrInvalidArgument)
	}
	req := &lockdv1.AcquireRequest{SessionId: s.id, SessionSecret: s.secret, Key: key, Wait: true, Value: ao.value,
		Limit: ao.limit, Mode: ao.mode, KeepPlace: true, NoDeadlockCheck: ao.noDeadlock}
	s.policy(ao, req)
	if ao.waitTimeout > 0 {
		// Round up: never ask to wait less than the caller asked.
		req.WaitTimeoutMs = int64((ao.waitTimeout + time.Millisecond - 1) / time.Millisecond)
	}
	every, err := checkWaitUpdates(ao)
	if err != nil {
		return nil, fmt.Errorf("acquire %q: %w", key, err)
	}
	stop := func() {}
	if ao.updates != nil && validateKey(key) == nil {
		stop = s.waitUpdates(ctx, key, every, ao.updates)
	}
	l, err := s.acquire(ctx, req, ao.waitTimeout == 0, stop)
	if err != nil {
		if s.Err() == nil && !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrPermissionDenied) {
			s.leaveQueue(key) // the place was kept for a retry that will not come
		}
		return nil, fmt.Errorf("acquire %q: %w", key, err)
	}
	return l, nil
}

// leaveQueue gives up the session's place in key's queue in the
// background (C2 #ct2-keep-place), retrying retryable errors while the
// session and the client live. A later Acquire of key cancels it first
// (acquire), so it never takes a place a new call resumed.
func (s *Session) leaveQueue(key string) {
	ctx, cancel := context.WithCancel(s.ctx)
	stop := context.AfterFunc(s.c.ctx, cancel)
	done := make(chan struct{})
	s.mu.Lock()
	if s.leaving == nil {
		s.leaving = map[string]leave{}
	}
	prev := s.leaving[key]
	s.leaving[key] = leave{cancel: cancel, done: done}
	s.mu.Unlock()
	prev.stop()
	s.c.wg.Add(1)
	go func() { // exits when the leave succeeds or fails for good, or the session or client ends (ctx)
		defer s.c.wg.Done()
		defer close(done)
		defer stop()
		defer cancel()
		err := s.c.retry(ctx, func(ctx context.Context) error {
			_, err := s.c.api.LeaveQueue(ctx, &lockdv1.LeaveQueueRequest{SessionId: s.id, SessionSecret: s.secret, Key: key})
			return fromStatus(ctx, err)
		})
		if err != nil && ctx.Err() == nil {
			s.c.log.LogAttrs(context.Background(), slog.LevelDebug, "leaving the queue failed", slog.String("error", err.Error()))
		}
		s.mu.Lock()
		if l, ok := s.leaving[key]; ok && l.done == done {
			delete(s.leaving, key)
		}
		s.mu.Unlock()
	}()
}

// leave is a LeaveQueue in the background.
type leave struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// stop cancels the leave and waits for it to end.
func (l leave) stop() {
	if l.cancel != nil {
		l.cancel()
		<-l.done
	}
}

// TryAcquire takes the lock named key if it is free and nobody waits for it;
// otherwise it returns ErrLocked at once, naming the holder when it can
// (its owner and token, read with one Inspect). Of the options only
// WithValue, WithLimit, Shared, Exclusive, WithLockDelay and WithMaxHold
// apply: a semaphore or shared lock is taken if a slot is free and nobody
// waits.
func (s *Session) TryAcquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	ao, err := acquireOpts(opts)
	if err != nil {
		return nil, fmt.Errorf("try acquire %q: %w", key, err)
	}
	req := &lockdv1.AcquireRequest{SessionId: s.id, SessionSecret: s.secret, Key: key, Value: ao.value,
		Limit: ao.limit, Mode: ao.mode}
	s.policy(ao, req)
	l, err := s.acquire(ctx, req, false, nil)
	if errors.Is(err, ErrLocked) {
		err = s.c.lockedBy(ctx, key)
	}
	if err != nil {
		return nil, fmt.Errorf("try acquire %q: %w", key, err)
	}
	return l, nil
}

// acquireOpts applies and checks the options of an acquire.
func acquireOpts(opts []AcquireOption) (acquireOptions, error) {
	var ao acquireOptions
	for _, opt := range opts {
		opt(&ao)
	}
	if err := invalidInput("value", wirelimits.ValidateValue(ao.value)); err != nil {
		return ao, err
	}
	switch {
	case ao.limit > wirelimits.MaxLimit:
		return ao, fmt.Errorf("%w: limit: %d, at most %d", ErrInvalidArgument, ao.limit, wirelimits.MaxLimit)
	case ao.mode != lockdv1.LockMode_LOCK_MODE_UNSPECIFIED && ao.limit > 1:
		return ao, fmt.Errorf("%w: limit: Shared and Exclusive take no limit", ErrInvalidArgument)
	case ao.multi() && ao.lockDelaySet && ao.lockDelay != 0:
		return ao, fmt.Errorf("%w: lock_delay: only for plain locks, not with WithLimit, Shared or Exclusive", ErrInvalidArgument)
	case ao.multi() && ao.maxHold != 0:
		return ao, fmt.Errorf("%w: max_hold: only for plain locks, not with WithLimit, Shared or Exclusive", ErrInvalidArgument)
	}
	if err := invalidInput("lock_delay", wirelimits.ValidateLockDelay(ao.lockDelay)); err != nil {
		return ao, err
	}
	return ao, invalidInput("max_hold", wirelimits.ValidateMaxHold(ao.maxHold))
}

// multi reports whether the options ask for a semaphore slot or a side of a
// read/write lock, which have no lock-delay or maximum hold (C2 #ct2-delay).
func (ao acquireOptions) multi() bool {
	return ao.limit > 1 || ao.mode != lockdv1.LockMode_LOCK_MODE_UNSPECIFIED
}

// policy fills in req's lock-delay (the Acquire's, else the session's; the
// session's is not sent for a semaphore slot or a read/write side) and
// maximum hold.
func (s *Session) policy(ao acquireOptions, req *lockdv1.AcquireRequest) {
	d := s.delay
	if ao.multi() {
		d = 0
	}
	if ao.lockDelaySet {
		d = ao.lockDelay
	}
	req.LockDelayMs, req.MaxHoldMs = d.Milliseconds(), ao.maxHold.Milliseconds()
}

// lockedBy is ErrLocked naming key's holder, read with one best-effort
// Inspect (bounded by a second, never retried): plain ErrLocked if that
// fails or the key went free meanwhile.
func (c *Client) lockedBy(ctx context.Context, key string) error {
	ictx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := c.api.Inspect(ictx, &lockdv1.InspectRequest{Key: key})
	if err != nil || !resp.GetHeld() {
		return ErrLocked
	}
	return fmt.Errorf("%w: held by %s", ErrLocked, lockInfo(resp.GetLock()).Holder())
}

// acquire sends req until it is answered; with untilCtx a WAIT_TIMEOUT (the
// server's maximum wait) is not final and the wait starts again.
//
// answered, if not nil, is called once the Acquire was answered (or failed),
// before the grant is recorded: WithWaitUpdates' reads end there.
func (s *Session) acquire(ctx context.Context, req *lockdv1.AcquireRequest, untilCtx bool, answered func()) (*Lock, error) {
	if answered != nil {
		defer answered() // also on an early return; a second call is a no-op
	}
	if err := validateKey(req.Key); err != nil {
		return nil, err
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	defer s.busyKey(req.Key)()
	// A leave of the key's queue still under way must not take the place
	// this call resumes.
	s.mu.Lock()
	pending := s.leaving[req.Key]
	delete(s.leaving, req.Key)
	s.mu.Unlock()
	pending.stop()
	resp, sent, err := s.send(ctx, req, untilCtx)
	if answered != nil {
		answered()
	}
	if err != nil {
		return nil, err
	}
	if !resp.GetGranted() {
		return nil, ErrLocked
	}
	d := s.extend(sent, ms(resp.GetRemainingMs()))
	var holdEnd time.Time // C2 #ct2-maxhold-sdk
	if req.MaxHoldMs > 0 {
		holdEnd = sent.Add(ms(req.MaxHoldMs))
	}
	return s.addLock(req.Key, resp.GetToken(), d, holdEnd)
}

// send sends req until it is answered, as acquire describes, and returns
// the answer with the send time of the request that got it. The session's
// end also ends the wait (its error then).
func (s *Session) send(ctx context.Context, req *lockdv1.AcquireRequest, untilCtx bool) (*lockdv1.AcquireResponse, time.Time, error) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	var (
		resp *lockdv1.AcquireResponse
		sent time.Time
	)
	err := s.c.retry(actx, func(ctx context.Context) error {
		for {
			var err error
			sent = s.c.clock.Now()
			resp, err = s.c.api.Acquire(ctx, req)
			err = fromStatus(ctx, err)
			if untilCtx && errors.Is(err, ErrWaitTimeout) {
				continue
			}
			return err
		}
	})
	if serr := s.Err(); serr != nil && ctx.Err() == nil {
		return nil, sent, serr // the session ended while waiting
	}
	if err != nil {
		s.checkServerErr(err)
		return nil, sent, err
	}
	return resp, sent, nil
}

// addLock records a granted lock trusted until deadline (the grant reply's
// bound) or the session's current deadline, whichever is later, or returns
// the session's existing Lock for the same grant. A grant whose lock-lost
// notice overtook its reply is lost at once.
//
// The session's deadline counts: the grant shows the session live, and the
// session's backend lifetime bounds the lock's (only a revoke ends it
// sooner; the next answer or a notice catches that, C2 #ct2-confirm). The
// reply's own bound counts from the Acquire's send time, so a grant that
// waited in the queue longer than Remaining − margin would otherwise be born
// expired.
//
// maxHoldAt (zero: none) is the Acquire's send time plus the grant's
// maximum hold (Lock.maxHoldAt); a Lock the session already had keeps its
// own.
func (s *Session) addLock(key string, token uint64, deadline, maxHoldAt time.Time) (*Lock, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	if s.deadline.After(deadline) {
		deadline = s.deadline
	}
	if token <= s.lostTok[key] {
		return nil, fmt.Errorf("%w: lost before its grant reply arrived", ErrLockLost)
	}
	if l := s.locks[key]; l != nil && l.token == token {
		if deadline.After(l.deadline) {
			l.deadline = deadline
		}
		return l, nil
	}
	s.lockSeq++
	l := &Lock{s: s, key: key, token: token, seq: s.lockSeq, deadline: deadline, maxHoldAt: maxHoldAt,
		done: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	s.locks[key] = l
	if deadline.Before(s.timerAt) {
		s.armLocked()
	}
	return l, nil
}
