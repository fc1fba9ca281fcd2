package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wirelimits"
)

// Session is a lockd session: the unit of liveness that locks live in. The
// client keeps it alive with heartbeats on the client's shared KeepAlive
// stream. It is safe for concurrent use.
//
// The session is trusted until its deadline: the monotonic time the client
// sent the latest acknowledged request, plus the Remaining the server
// granted in the reply, minus the safety margin (C2 #ct2-deadline). Done
// closes, and every lock of the session is lost, at that instant unless a
// newer acknowledgement extended it — also when the server is unreachable
// and no reply comes at all. A session whose Done has closed is never used
// again; open a new one.
type Session struct {
	c        *Client
	id       string
	secret   []byte // proves ownership (C2 #ct2-ownership); never shown
	ttl      time.Duration
	margin   time.Duration
	interval time.Duration
	delay    time.Duration // WithSessionLockDelay
	done     chan struct{}
	// ctx is cancelled, with the session's error as cause, when done
	// closes.
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time
	timer    Timer
	timerAt  time.Time // when timer fires
	timerGen uint64
	err      error
	locks    map[string]*Lock
	closedOK bool // CloseSession succeeded
	// lockSeq numbers the locks added to the session (Lock.seq): a
	// heartbeat answer must list the locks numbered up to the lockSeq of
	// when its request was sent (C2 #ct2-confirm).
	lockSeq uint64
	// lostTok is, per key, the highest token a lock-lost notice named: a
	// grant reply that arrives after its own notice is refused.
	lostTok map[string]uint64
	// acks are notice ids to acknowledge with the next heartbeat on the
	// stream numbered ackGen, the one they came on: another replica may
	// use the same ids for other notices (C2 #ct2-failover).
	acks   []uint64
	ackGen uint64
	// leaving are the LeaveQueue calls under way, by key.
	leaving map[string]leave
	// busy counts, per key, the Acquire calls and releases under way: a
	// grant of such a key that no Lock knows is not an orphan (answer).
	busy map[string]int
}

// maxLostKeys bounds Session.lostTok; when it is full it starts again
// (what it guards, a grant reply overtaken by its own notice, is also
// caught by the next heartbeat answer).
const maxLostKeys = 4096

// NewSession opens a session. Its TTL is WithSessionTTL, else the client's
// WithTTL, else the server's lock.session.ttl. Retryable errors are retried
// until ctx ends.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	so := sessionOptions{ttl: c.opts.ttl}
	for _, opt := range opts {
		opt(&so)
	}
	if so.ttl < 0 || so.ttl%time.Millisecond != 0 {
		return nil, fmt.Errorf("new session: %w: ttl: %v is negative or not whole milliseconds", ErrInvalidArgument, so.ttl)
	}
	if err := invalidInput("owner", wirelimits.ValidateOwner(so.owner)); err != nil {
		return nil, fmt.Errorf("new session: %w", err)
	}
	if err := invalidInput("labels", wirelimits.ValidateLabels(so.labels)); err != nil {
		return nil, fmt.Errorf("new session: %w", err)
	}
	if err := invalidInput("lock_delay", wirelimits.ValidateLockDelay(so.lockDelay)); err != nil {
		return nil, fmt.Errorf("new session: %w", err)
	}
	// The client's own settings against the TTL asked for, before the
	// server opens anything.
	if err := checkTiming(so.ttl, c.opts.safetyMargin, c.opts.heartbeatInterval); err != nil {
		return nil, fmt.Errorf("new session: %w", err)
	}
	var (
		resp *lockdv1.OpenSessionResponse
		sent time.Time
	)
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		sent = c.clock.Now()
		resp, err = c.api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: so.ttl.Milliseconds(), Owner: so.owner, Labels: so.labels})
		return fromStatus(ctx, err)
	})
	if err != nil {
		return nil, fmt.Errorf("new session: %w", err)
	}
	s := &Session{
		c:        c,
		id:       resp.GetSessionId(),
		secret:   resp.GetSessionSecret(),
		ttl:      ms(resp.GetTtlMs()),
		margin:   ms(resp.GetSafetyMarginMs()),
		interval: ms(resp.GetHeartbeatIntervalMs()),
		done:     make(chan struct{}),
		locks:    map[string]*Lock{},
		delay:    so.lockDelay,
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	if c.opts.safetyMargin > 0 {
		s.margin = c.opts.safetyMargin
	}
	if s.interval <= 0 {
		s.interval = s.ttl / 3
	}
	// The settings in force (the client's, else the server's) against the
	// TTL the backend applies. The server's own interval is allowed its
	// TTL/3 default when the margin leaves less than that (as the server
	// does); it must still leave time inside the trust window.
	var terr error
	switch {
	case s.margin <= 0 || s.ttl <= 0:
		terr = fmt.Errorf("%w: safety margin %v must be > 0 and < ttl/2 (ttl %v)", ErrInvalidArgument, s.margin, s.ttl)
	case c.opts.heartbeatInterval > 0:
		s.interval = c.opts.heartbeatInterval
		terr = checkTiming(s.ttl, s.margin, s.interval)
	default:
		terr = checkTiming(s.ttl, s.margin, 0)
		if terr == nil && s.interval >= s.ttl-s.margin {
			terr = fmt.Errorf("%w: the server's heartbeat interval %v must be below ttl − safety margin = %v",
				ErrInvalidArgument, s.interval, s.ttl-s.margin)
		}
	}
	if terr != nil {
		s.abandon()
		return nil, fmt.Errorf("new session: %w", terr)
	}
	s.deadline = trustFrom(c.clock, sent).Add(ms(resp.GetRemainingMs()) - s.margin)
	if !c.clock.Now().Before(s.deadline) {
		s.abandon()
		return nil, fmt.Errorf("new session: %w", ErrSessionExpired)
	}
	s.mu.Lock()
	s.armLocked()
	s.mu.Unlock()
	c.ka.add(s)
	return s, nil
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

// ID returns the session id.
func (s *Session) ID() string { return s.id }

// TTL returns the TTL the backend applies to the session.
func (s *Session) TTL() time.Duration { return s.ttl }

// Done is closed when the session can no longer be trusted: its deadline
// passed, the server reported it dead, or it was closed. Err says which.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session is trusted; after Done is closed it is
// ErrSessionExpired, ErrSessionDead or ErrClosed (wrapped).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Context returns a context that is cancelled when Done closes; its cause
// (context.Cause) is Err.
func (s *Session) Context() context.Context { return s.ctx }

// Deadline returns the instant (on the client's clock) at which the session
// stops being trusted unless a newer acknowledgement extends it.
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// armLocked (re)starts the deadline timer at the earliest of the session's
// and its locks' deadlines (s.mu held).
func (s *Session) armLocked() {
	if s.timer != nil {
		s.timer.Stop()
	}
	at := s.earliestLocked()
	s.timerGen++
	gen := s.timerGen
	s.timerAt = at
	s.timer = s.c.clock.AfterFunc(at.Sub(s.c.clock.Now()), func() { s.deadlineReached(gen) })
}

// earliestLocked is the earliest of the session's and its locks'
// deadlines (s.mu held).
func (s *Session) earliestLocked() time.Time {
	at := s.deadline
	for _, l := range s.locks {
		if l.deadline.Before(at) {
			at = l.deadline
		}
	}
	return at
}

// earliestDeadline is earliestLocked for a session that has not ended;
// ok is false once it has.
func (s *Session) earliestDeadline() (at time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return time.Time{}, false
	}
	return s.earliestLocked(), true
}

func (s *Session) deadlineReached(gen uint64) {
	s.mu.Lock()
	if gen != s.timerGen || s.err != nil {
		s.mu.Unlock()
		return
	}
	now := s.c.clock.Now()
	if !now.Before(s.deadline) {
		s.mu.Unlock()
		s.end(ErrSessionExpired)
		return
	}
	// A lock whose own deadline passed: no answer confirmed it since.
	var lost []*Lock
	for key, l := range s.locks {
		if !now.Before(l.deadline) {
			delete(s.locks, key)
			lost = append(lost, l)
		}
	}
	s.armLocked() // extended since armed, or an early wake-up of a real timer
	s.mu.Unlock()
	for _, l := range lost {
		l.end(fmt.Errorf("%w: not confirmed by the server before its deadline", ErrLockLost))
	}
}

// extend applies an acknowledgement of the session (a grant reply): a
// request sent at sent (client clock) was answered with remaining. The
// session's deadline becomes the later of the current one and sent +
// remaining − margin; its locks are not extended (only answers that confirm
// a lock extend it: answer). A deadline that has already passed is never
// revived: the session ends instead. It returns the new deadline bound.
func (s *Session) extend(sent time.Time, remaining time.Duration) time.Time {
	d := trustFrom(s.c.clock, sent).Add(remaining - s.margin)
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return d
	}
	if !s.c.clock.Now().Before(s.deadline) {
		s.mu.Unlock()
		s.end(ErrSessionExpired)
		return d
	}
	if d.After(s.deadline) {
		// The timer stays armed at the earlier deadline: when it fires it
		// finds the later one and arms itself again (deadlineReached), so
		// an extension costs no timer operation.
		s.deadline = d
	}
	s.mu.Unlock()
	return d
}

// answer applies a heartbeat answer to a request sent at sent, when the
// session's lockSeq was seq (C2 #ct2-confirm). With held set (the server
// confirms locks), a lock listed with its token is confirmed, and a lock
// numbered up to seq that is not listed is lost at once; without it (an
// older server), every lock counts as confirmed. When live (a live answer
// without error), the session and every confirmed lock are extended to
// sent + remaining − margin.
func (s *Session) answer(sent time.Time, seq uint64, live bool, remaining time.Duration, held *lockdv1.HeldLocks) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	if live && !s.c.clock.Now().Before(s.deadline) {
		s.mu.Unlock()
		s.end(ErrSessionExpired)
		return
	}
	var listed map[string]uint64
	if held != nil {
		listed = make(map[string]uint64, len(held.GetLocks()))
		for _, h := range held.GetLocks() {
			listed[h.GetKey()] = h.GetToken()
		}
	}
	d := trustFrom(s.c.clock, sent).Add(remaining - s.margin)
	var lost []*Lock
	for key, l := range s.locks {
		if tok, ok := listed[key]; held == nil || (ok && tok == l.token) {
			if live && d.After(l.deadline) {
				l.deadline = d // the timer finds it when it fires (deadlineReached)
			}
			continue
		}
		if l.seq <= seq {
			delete(s.locks, key)
			s.fenceLocked(key, l.token)
			lost = append(lost, l)
		}
	}
	if live && d.After(s.deadline) {
		s.deadline = d
	}
	// Grants of the session that no Lock and no call under way knows: a
	// place kept for a call that gave up was handed the key (C2
	// #ct2-keep-place). Release them.
	var orphans []*lockdv1.HeldLock
	for _, h := range held.GetLocks() {
		if s.locks[h.GetKey()] == nil && s.busy[h.GetKey()] == 0 && h.GetToken() > s.lostTok[h.GetKey()] {
			orphans = append(orphans, h)
		}
	}
	s.mu.Unlock()
	for _, l := range lost {
		l.end(fmt.Errorf("%w: not confirmed by the server", ErrLockLost))
	}
	for _, h := range orphans {
		s.releaseOrphan(h.GetKey(), h.GetToken())
	}
}

// releaseOrphan releases, in the background and best effort, a grant of
// the session that no Lock knows (fenced by its token: never a newer one).
func (s *Session) releaseOrphan(key string, token uint64) {
	s.mu.Lock()
	s.fenceLocked(key, token) // once is enough; a later answer may list it again meanwhile
	s.mu.Unlock()
	s.c.wg.Add(1)
	go func() { // exits when the RPC returns: bounded by DefaultCloseTimeout, the session and the client
		defer s.c.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, DefaultCloseTimeout)
		defer cancel()
		stop := context.AfterFunc(s.c.ctx, cancel)
		defer stop()
		_, err := s.c.api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: s.id, SessionSecret: s.secret, Key: key, Token: token})
		s.c.log.LogAttrs(context.Background(), slog.LevelDebug, "released a grant no lock knew",
			slog.String("key", key), slog.Uint64("token", token), slog.Bool("ok", err == nil))
	}()
}

// busyKey marks a call on key under way until the returned function is
// called.
func (s *Session) busyKey(key string) func() {
	s.mu.Lock()
	if s.busy == nil {
		s.busy = map[string]int{}
	}
	s.busy[key]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.busy[key]--; s.busy[key] <= 0 {
			delete(s.busy, key)
		}
		s.mu.Unlock()
	}
}

// beatState returns what a heartbeat about to be sent carries: the
// session's lockSeq and the notice ids to acknowledge (taken: a lost
// acknowledgement only makes the server repeat its notice).
func (s *Session) beatState(gen uint64) (seq uint64, acks []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ackGen == gen {
		acks = s.acks
	}
	s.acks = nil // acks of an older stream are dropped, never sent here
	return s.lockSeq, acks
}

// fenceLocked records that grants of key up to token are gone (s.mu held).
func (s *Session) fenceLocked(key string, token uint64) {
	if token <= s.lostTok[key] {
		return
	}
	if s.lostTok == nil || len(s.lostTok) >= maxLostKeys {
		s.lostTok = map[string]uint64{}
	}
	s.lostTok[key] = token
}

// end stops trusting the session and every lock in it (idempotent) and
// stops its heartbeats. A locally expired session is also closed on the
// server, best effort, so its locks are freed before the TTL.
func (s *Session) end(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	if s.timer != nil {
		s.timer.Stop()
	}
	close(s.done)
	s.cancel(err)
	locks := s.locks
	s.locks = map[string]*Lock{}
	s.mu.Unlock()
	for _, l := range locks {
		l.end(err)
	}
	s.c.ka.remove(s)
	s.c.log.LogAttrs(context.Background(), slog.LevelDebug, "session ended", slog.String("error", err.Error()))
	if errors.Is(err, ErrSessionExpired) {
		s.abandon()
	}
}

// abandon closes the session on the server in the background, best effort.
func (s *Session) abandon() {
	s.c.wg.Add(1)
	go func() { // exits when the RPC returns: bounded by DefaultCloseTimeout and Client.Close
		defer s.c.wg.Done()
		ctx, cancel := context.WithTimeout(s.c.ctx, DefaultCloseTimeout)
		defer cancel()
		_, _ = s.c.api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: s.id, SessionSecret: s.secret})
	}()
}

// Close ends the session: Done closes and every lock of the session is lost
// at once; then the session is closed on the server, releasing its locks.
// The server call is retried until ctx ends. Closing a session the server
// already reported dead returns nil.
func (s *Session) Close(ctx context.Context) error {
	s.end(fmt.Errorf("session closed: %w", ErrClosed))
	s.mu.Lock()
	serverDead := errors.Is(s.err, ErrSessionDead) && !errors.Is(s.err, ErrSessionExpired)
	done := s.closedOK
	s.mu.Unlock()
	if serverDead || done {
		return nil
	}
	err := s.c.retry(ctx, func(ctx context.Context) error {
		_, err := s.c.api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: s.id, SessionSecret: s.secret})
		return fromStatus(ctx, err)
	})
	if err != nil {
		return fmt.Errorf("close session: %w", err)
	}
	s.mu.Lock()
	s.closedOK = true
	s.mu.Unlock()
	return nil
}

// checkServerErr ends the session when the server reported it dead.
func (s *Session) checkServerErr(err error) {
	if errors.Is(err, ErrSessionDead) && !errors.Is(err, ErrSessionExpired) {
		s.end(err)
	}
}

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
		Limit: ao.limit, Mode: ao.mode, KeepPlace: true}
	s.policy(ao, req)
	if ao.waitTimeout > 0 {
		// Round up: never ask to wait less than the caller asked.
		req.WaitTimeoutMs = int64((ao.waitTimeout + time.Millisecond - 1) / time.Millisecond)
	}
	l, err := s.acquire(ctx, req, ao.waitTimeout == 0)
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
	l, err := s.acquire(ctx, req, false)
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
func (s *Session) acquire(ctx context.Context, req *lockdv1.AcquireRequest, untilCtx bool) (*Lock, error) {
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
	// The session's end also ends the wait.
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
		return nil, serr // the session ended while waiting
	}
	if err != nil {
		s.checkServerErr(err)
		return nil, err
	}
	if !resp.GetGranted() {
		return nil, ErrLocked
	}
	d := s.extend(sent, ms(resp.GetRemainingMs()))
	return s.addLock(req.Key, resp.GetToken(), d)
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
func (s *Session) addLock(key string, token uint64, deadline time.Time) (*Lock, error) {
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
	l := &Lock{s: s, key: key, token: token, seq: s.lockSeq, deadline: deadline, done: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	s.locks[key] = l
	if deadline.Before(s.timerAt) {
		s.armLocked()
	}
	return l, nil
}

// lockLost applies a server notice that (key, token) is gone, and queues
// its acknowledgement for the stream numbered gen it came on (none when gen
// is 0: a stream the client left sends nothing more); it reports whether
// one was queued. Tokens of a key
// only rise, so the notice also ends an older grant of the key, and fences
// a grant reply of that token still on its way.
func (s *Session) lockLost(n *lockdv1.LockLost, gen uint64) (ack bool) {
	key, token := n.GetKey(), n.GetToken()
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return false
	}
	if n.GetNoticeId() != 0 && gen != 0 {
		if s.ackGen != gen {
			s.acks, s.ackGen = nil, gen
		}
		s.acks = append(s.acks, n.GetNoticeId())
		ack = true
	}
	s.fenceLocked(key, token)
	l := s.locks[key]
	if l == nil || l.token > token {
		s.mu.Unlock()
		return ack
	}
	delete(s.locks, key)
	s.mu.Unlock()
	why := "gone"
	switch n.GetReason() {
	case lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED:
		why = "revoked"
	case lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED:
		why = "expired"
	case lockdv1.LockLostReason_LOCK_LOST_REASON_SERVER_SHUTDOWN:
		why = "server shutting down"
	case lockdv1.LockLostReason_LOCK_LOST_REASON_MAX_HOLD:
		l.end(fmt.Errorf("%w: revoked by the server", ErrMaxHold))
		return ack
	}
	l.end(fmt.Errorf("%w: %s", ErrLockLost, why))
	return ack
}

// Lock is a granted lock. It is trusted until Done closes.
type Lock struct {
	s     *Session
	key   string
	token uint64
	seq   uint64 // Session.lockSeq when added
	// deadline (Session.mu) is when the lock stops being trusted unless an
	// answer that confirms it extends it; never after the session's.
	deadline time.Time
	done     chan struct{}
	ctx      context.Context
	cancel   context.CancelCauseFunc

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
