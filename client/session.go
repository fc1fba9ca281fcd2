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
