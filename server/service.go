package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/server/internal/sessions"
	"lock.dev/lockd/store"
)

// service implements lockdv1.LockServiceServer on a Server. It embeds the
// Unsafe interface, so a new RPC in the proto is a compile error here until
// it is implemented.
type service struct {
	lockdv1.UnsafeLockServiceServer
	*Server
}

var _ lockdv1.LockServiceServer = service{}

// advertised returns the C5 lock.client.* settings for a session of ttl.
func (s *Server) advertised(ttl time.Duration) (margin, heartbeat time.Duration) {
	margin = s.cfg.SafetyMargin
	heartbeat = s.cfg.HeartbeatInterval
	if heartbeat <= 0 || heartbeat > ttl-2*margin {
		heartbeat = ttl / 3
	}
	return margin, heartbeat
}

// OpenSession implements the OpenSession RPC.
func (s service) OpenSession(ctx context.Context, req *lockdv1.OpenSessionRequest) (*lockdv1.OpenSessionResponse, error) {
	recv := time.Now()
	ttl := time.Duration(req.TtlMs) * time.Millisecond
	if req.TtlMs == 0 {
		ttl = s.cfg.SessionTTL
	}
	if err := s.checkTTL(req.TtlMs, ttl); err != nil {
		return nil, s.toStatus(ctx, "OpenSession", err)
	}
	if err := s.checkMaxTTL(ttl); err != nil {
		return nil, s.toStatus(ctx, "OpenSession", err)
	}
	release, err := s.admitOpen(ctx) // limits.go
	if err != nil {
		return nil, err
	}
	defer release()
	if s.refuseWhileStopping() != nil {
		return nil, s.toStatus(ctx, "OpenSession", errShuttingDown)
	}
	if err := store.ValidateOwner(req.Owner); err != nil {
		return nil, s.toStatus(ctx, "OpenSession", invalid("owner", err))
	}
	if err := store.ValidateLabels(req.Labels); err != nil {
		return nil, s.toStatus(ctx, "OpenSession", invalid("labels", err))
	}
	secret, hash := newSessionSecret()
	principal, bind := principalOption(ctx) // principal.go
	sess, err := s.st.OpenSession(ctx, ttl, store.WithSecretHash(hash), store.WithOwner(req.Owner, req.Labels), bind)
	if err != nil {
		return nil, s.toStatus(ctx, "OpenSession", fmt.Errorf("open session: %w", err))
	}
	if !s.sess.Open(sess, recv, hash, principal) {
		// Shutdown began while the store opened it: do not hand it out.
		cctx, cancel := context.WithTimeout(telemetry.WithServerClose(context.WithoutCancel(ctx)), closeTimeout)
		_, _ = s.st.CloseSession(cctx, sess.ID)
		cancel()
		return nil, s.toStatus(ctx, "OpenSession", errShuttingDown)
	}
	margin, hb := s.advertised(sess.TTL)
	return &lockdv1.OpenSessionResponse{
		SessionId:           string(sess.ID),
		TtlMs:               sess.TTL.Milliseconds(),
		RemainingMs:         max(sess.Remaining, 0).Milliseconds(),
		SafetyMarginMs:      margin.Milliseconds(),
		HeartbeatIntervalMs: hb.Milliseconds(),
		SessionSecret:       secret,
	}, nil
}

// checkTTL validates a requested session TTL (field ttl_ms).
func (s *Server) checkTTL(ms int64, ttl time.Duration) error {
	if ms < 0 || ms > int64(store.MaxTTL/time.Millisecond) {
		return invalidf("ttl_ms", "%d out of range [%d, %d]", ms, store.MinTTL.Milliseconds(), store.MaxTTL.Milliseconds())
	}
	if err := store.ValidateTTL(ttl); err != nil {
		return invalid("ttl_ms", err)
	}
	if ttl <= 2*s.cfg.SafetyMargin {
		return invalidf("ttl_ms", "%v must exceed twice the safety margin (%v)", ttl, s.cfg.SafetyMargin)
	}
	return nil
}

// CloseSession implements the CloseSession RPC.
func (s service) CloseSession(ctx context.Context, req *lockdv1.CloseSessionRequest) (*lockdv1.CloseSessionResponse, error) {
	id := store.SessionID(req.SessionId)
	if err := store.ValidateSessionID(id); err != nil {
		return nil, s.toStatus(ctx, "CloseSession", invalid("session_id", err))
	}
	if err := s.checkSecret(ctx, "CloseSession", id, req.SessionSecret); err != nil {
		return nil, s.toStatus(ctx, "CloseSession", err)
	}
	r := s.sess.Pin(id)
	defer s.sess.Unpin(r)
	s.sess.BeginClose(r)
	n, err := s.st.CloseSession(ctx, id)
	if err != nil {
		// The silence loop retries with backoff; the record keeps who
		// asked (the caller in ctx) for the audit trail of the retried
		// close.
		by, rule, caller := telemetry.CallerOf(ctx)
		s.sess.RetryCloseLater(r, by, rule, caller)
		return nil, s.toStatus(ctx, "CloseSession", fmt.Errorf("close session: %w", err))
	}
	s.sess.MarkGone(r)
	return &lockdv1.CloseSessionResponse{Released: int64(n)}, nil
}

// Acquire implements the Acquire RPC.
func (s service) Acquire(ctx context.Context, req *lockdv1.AcquireRequest) (*lockdv1.AcquireResponse, error) {
	if len(req.Keys) > 0 {
		return s.acquireAll(ctx, req) // acquire_all.go
	}
	recv := time.Now()
	id := store.SessionID(req.SessionId)
	r, err := s.beginAcquire(ctx, id, req.SessionSecret, s.checkAcquire(req))
	if err != nil {
		return nil, s.toStatus(ctx, "Acquire", err)
	}
	defer s.endAcquire(r)
	// Taken before the store is asked (sessions.Table.Grant).
	mark := s.sess.CloseMark(r)
	slot, err := s.admitAcquire(r, req.Key, req.Wait) // limits.go
	if err != nil {
		return nil, err
	}
	defer slot.release()

	var (
		g       store.Grant
		granted = true
	)
	if !req.Wait {
		g, granted, err = s.st.TryInsert(ctx, id, req.Key, acquireOptions(req)...)
	} else {
		g, err = s.waitAcquire(ctx, id, req)
	}
	switch {
	case err != nil:
		if errors.Is(err, store.ErrSessionDead) {
			s.sess.MarkGone(r)
		}
		return nil, s.toStatus(ctx, "Acquire", fmt.Errorf("acquire: %w", err))
	case !granted:
		return &lockdv1.AcquireResponse{Key: req.Key}, nil
	}
	waited := time.Since(recv) // observed once the grant is tracked

	if err := s.applyPolicy(ctx, id, g, req); err != nil { // delay.go
		return nil, s.toStatus(ctx, "Acquire", fmt.Errorf("acquire: %w", err))
	}
	if len(req.Value) > 0 {
		// The value is display data: a grant is never refused over it
		// (C2 #ct2-holder). A failure (the grant already revoked, a
		// backend error) leaves the grant without a value.
		if err := s.st.SetValue(ctx, id, g.Key, g.Token, req.Value); err != nil {
			s.log.WarnContext(ctx, telemetry.EventGrantValueNotStored, "key", g.Key, "token", g.Token, "error", err)
		}
	}
	// Tracked, a grant is counted as held from here, no longer in
	// progress (LIM-1).
	outcome := s.sess.Grant(r, mark, recv, g, slot.slot)
	if h := s.afterAcquireTrack.Load(); h != nil {
		(*h)(g.Key) // tests hold the window between tracking and reply open
	}
	if outcome == sessions.Granted {
		s.grantObserved(g.Key, waited) // estimate.go
	}
	switch outcome {
	case sessions.GrantOverlapped:
		// Retryable: the retry (Acquire is idempotent for a key the
		// session holds) is answered from a fresh store answer.
		return nil, s.toStatus(ctx, "Acquire", fmt.Errorf("acquire: %w", errCloseOverlap))
	case sessions.GrantEnding:
		// The session is being closed, which takes this grant with it.
		return nil, s.toStatus(ctx, "Acquire", fmt.Errorf("acquire: %w", store.ErrSessionDead))
	}
	return &lockdv1.AcquireResponse{
		Granted:     true,
		Key:         g.Key,
		Token:       g.Token,
		RemainingMs: max(g.Remaining, 0).Milliseconds(),
	}, nil
}

// checkAcquire validates an AcquireRequest.
func (s *Server) checkAcquire(req *lockdv1.AcquireRequest) error {
	if err := store.ValidateSessionID(store.SessionID(req.SessionId)); err != nil {
		return invalid("session_id", err)
	}
	if err := store.ValidateKey(req.Key); err != nil {
		return invalid("key", err)
	}
	if err := store.ValidateValue(req.Value); err != nil {
		return invalid("value", err)
	}
	if _, err := store.NewAcquireOptions(acquireOptions(req)...); err != nil {
		field := "limit"
		if req.Mode != lockdv1.LockMode_LOCK_MODE_UNSPECIFIED {
			field = "mode"
		}
		return invalid(field, err)
	}
	switch {
	case req.WaitTimeoutMs < 0 || req.WaitTimeoutMs > MaxWait.Milliseconds():
		return invalidf("wait_timeout_ms", "%d out of range [0, %d]", req.WaitTimeoutMs, MaxWait.Milliseconds())
	case !req.Wait && req.WaitTimeoutMs != 0:
		return invalidf("wait_timeout_ms", "must be 0 when wait is false")
	}
	return s.checkPolicy(req) // delay.go
}

// acquireOptions are the store options of req's limit and mode (C2
// #ct2-multi); none for a plain lock, so the plain grant paths serve it.
func acquireOptions(req *lockdv1.AcquireRequest) []store.AcquireOption {
	var opts []store.AcquireOption
	if req.Limit > 1 {
		opts = append(opts, store.WithLimit(req.Limit))
	}
	switch req.Mode {
	case lockdv1.LockMode_LOCK_MODE_UNSPECIFIED:
	case lockdv1.LockMode_LOCK_MODE_EXCLUSIVE:
		opts = append(opts, store.WithMode(store.ModeExclusive))
	case lockdv1.LockMode_LOCK_MODE_SHARED:
		opts = append(opts, store.WithMode(store.ModeShared))
	default:
		opts = append(opts, store.WithMode(store.Mode(255))) // unknown: NewAcquireOptions refuses it
	}
	return opts
}

// waitAcquire queues in the backend's FIFO queue for the key, bounded by the
// wait timeout (MaxWait when 0), the caller's context and Shutdown. The
// backend wakes the waiter; nothing here polls.
func (s *Server) waitAcquire(ctx context.Context, id store.SessionID, req *lockdv1.AcquireRequest) (store.Grant, error) {
	timeout := time.Duration(s.maxWait.Load())
	if req.WaitTimeoutMs > 0 {
		timeout = time.Duration(req.WaitTimeoutMs) * time.Millisecond
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.ctx, func() { cancel(errShuttingDown) })
	defer stop()
	wctx, cancelTimeout := context.WithTimeoutCause(wctx, timeout, errWaitTimeout)
	defer cancelTimeout()
	opts := acquireOptions(req)
	if req.KeepPlace {
		// The place outlives this call: the client resumes it with its
		// next Acquire, or leaves it (C2 #ct2-keep-place).
		opts = append(opts, store.KeepPlace())
	}
	if req.NoDeadlockCheck {
		opts = append(opts, store.NoDeadlockCheck()) // C2 #ct2-deadlock
	}
	g, err := s.st.Acquire(wctx, id, req.Key, opts...)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		err = fmt.Errorf("%w: %w", context.Cause(wctx), err)
		if req.KeepPlace && req.WaitTimeoutMs > 0 && errors.Is(err, errWaitTimeout) {
			// The caller's own wait timeout: it gives up its place. A
			// failure leaves the place to its session's end, or to the
			// caller's own LeaveQueue.
			lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
			if lerr := s.st.LeaveQueue(lctx, id, req.Key); lerr != nil {
				s.log.WarnContext(ctx, telemetry.EventLeaveQueueFailed, "key", req.Key, "error", lerr)
			}
			lcancel()
		}
	}
	return g, err
}

// LeaveQueue implements the LeaveQueue RPC (C2 #ct2-keep-place).
func (s service) LeaveQueue(ctx context.Context, req *lockdv1.LeaveQueueRequest) (*lockdv1.LeaveQueueResponse, error) {
	id := store.SessionID(req.SessionId)
	var err error
	switch {
	case store.ValidateSessionID(id) != nil:
		err = invalid("session_id", store.ValidateSessionID(id))
	case store.ValidateKey(req.Key) != nil:
		err = invalid("key", store.ValidateKey(req.Key))
	}
	if err == nil {
		err = s.checkSecret(ctx, "LeaveQueue", id, req.SessionSecret)
	}
	if err != nil {
		return nil, s.toStatus(ctx, "LeaveQueue", err)
	}
	if err := s.st.LeaveQueue(ctx, id, req.Key); err != nil {
		return nil, s.toStatus(ctx, "LeaveQueue", fmt.Errorf("leave queue: %w", err))
	}
	return &lockdv1.LeaveQueueResponse{}, nil
}

// validGrantRef checks the fields that name one grant of a session: its
// id, key and token.
func validGrantRef(id store.SessionID, key string, token uint64) error {
	switch {
	case store.ValidateSessionID(id) != nil:
		return invalid("session_id", store.ValidateSessionID(id))
	case store.ValidateKey(key) != nil:
		return invalid("key", store.ValidateKey(key))
	case token == 0:
		return invalidf("token", "must be non-zero")
	}
	return nil
}

// Release implements the Release RPC.
func (s service) Release(ctx context.Context, req *lockdv1.ReleaseRequest) (*lockdv1.ReleaseResponse, error) {
	id := store.SessionID(req.SessionId)
	err := validGrantRef(id, req.Key, req.Token)
	if err == nil {
		err = s.checkSecret(ctx, "Release", id, req.SessionSecret)
	}
	if err != nil {
		return nil, s.toStatus(ctx, "Release", err)
	}
	if err := s.st.DeleteIfOwner(ctx, id, req.Key, req.Token); err != nil {
		return nil, s.toStatus(ctx, "Release", fmt.Errorf("release: %w", err))
	}
	s.sess.Untrack(id, req.Key, req.Token) // the hold is observed by sessions.Config.Ended
	return &lockdv1.ReleaseResponse{}, nil
}

// Inspect implements the Inspect RPC.
func (s service) Inspect(ctx context.Context, req *lockdv1.InspectRequest) (*lockdv1.InspectResponse, error) {
	if err := store.ValidateKey(req.Key); err != nil {
		return nil, s.toStatus(ctx, "Inspect", invalid("key", err))
	}
	info, found, err := s.st.Inspect(ctx, req.Key)
	if err != nil {
		return nil, s.toStatus(ctx, "Inspect", fmt.Errorf("inspect: %w", err))
	}
	if !found {
		if info.DelayRemaining > 0 { // a lock-delay keeps the free key (C2 #ct2-delay)
			return &lockdv1.InspectResponse{Lock: &lockdv1.LockInfo{Key: req.Key, DelayRemainingMs: max(info.DelayRemaining.Milliseconds(), 1)}}, nil
		}
		return &lockdv1.InspectResponse{}, nil
	}
	return &lockdv1.InspectResponse{Held: true, Lock: s.withEstimates(lockInfo(info), info)}, nil // estimate.go
}

func lockInfo(info store.LockInfo) *lockdv1.LockInfo {
	out := &lockdv1.LockInfo{Key: info.Key, SessionId: string(info.Session), Token: info.Token,
		Owner: info.Owner, Labels: info.Labels, Value: info.Value, LockDelayMs: info.LockDelay.Milliseconds()}
	if !info.AcquiredAt.IsZero() {
		out.AcquiredAt = timestamppb.New(info.AcquiredAt)
	}
	for _, w := range info.Waiters {
		out.Waiters = append(out.Waiters, string(w))
	}
	if len(info.Holders) > 0 {
		out.Limit = max(info.Limit, 1)
	}
	for _, h := range info.Holders {
		lh := &lockdv1.LockHolder{SessionId: string(h.Session), Token: h.Token, Mode: lockMode(h.Mode),
			Owner: h.Owner, Labels: h.Labels, Value: h.Value}
		if !h.AcquiredAt.IsZero() {
			lh.AcquiredAt = timestamppb.New(h.AcquiredAt)
		}
		out.Holders = append(out.Holders, lh)
	}
	return out
}

// lockMode is the wire form of a grant's mode.
func lockMode(m store.Mode) lockdv1.LockMode {
	switch m {
	case store.ModeExclusive:
		return lockdv1.LockMode_LOCK_MODE_EXCLUSIVE
	case store.ModeShared:
		return lockdv1.LockMode_LOCK_MODE_SHARED
	}
	return lockdv1.LockMode_LOCK_MODE_UNSPECIFIED
}

// List implements the List RPC. Page tokens are the last key of the
// previous page, base64url-encoded (opaque to clients).
func (s service) List(ctx context.Context, req *lockdv1.ListRequest) (*lockdv1.ListResponse, error) {
	if err := store.ValidatePrefix(req.Prefix); err != nil {
		return nil, s.toStatus(ctx, "List", invalid("prefix", err))
	}
	limit, err := store.ListLimit(int(req.Limit))
	if err != nil {
		return nil, s.toStatus(ctx, "List", invalid("limit", err))
	}
	after := ""
	if req.PageToken != "" {
		raw, derr := base64.RawURLEncoding.DecodeString(req.PageToken)
		if derr != nil || store.ValidateKey(string(raw)) != nil {
			return nil, s.toStatus(ctx, "List", invalidf("page_token", "not a token returned by List"))
		}
		after = string(raw)
	}
	infos, err := s.st.List(ctx, req.Prefix, after, limit)
	if err != nil {
		return nil, s.toStatus(ctx, "List", fmt.Errorf("list: %w", err))
	}
	resp := &lockdv1.ListResponse{}
	for _, info := range infos {
		resp.Locks = append(resp.Locks, lockInfo(info))
	}
	if len(infos) == limit {
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(infos[len(infos)-1].Key))
	}
	return resp, nil
}

// Revoke implements the Revoke RPC.
func (s service) Revoke(ctx context.Context, req *lockdv1.RevokeRequest) (*lockdv1.RevokeResponse, error) {
	if err := store.ValidateKey(req.Key); err != nil {
		return nil, s.toStatus(ctx, "Revoke", invalid("key", err))
	}
	g, found, err := s.st.Revoke(ctx, req.Key)
	if err != nil {
		return nil, s.toStatus(ctx, "Revoke", fmt.Errorf("revoke: %w", err))
	}
	if !found {
		return &lockdv1.RevokeResponse{}, nil
	}
	// The lock-loss watch delivers this too (also for holders on other
	// lockd instances); telling a holder of this instance now is faster,
	// and LockLost notifies once.
	s.sess.LockLost(g.Session, g.Key, g.Token, lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED)
	// A semaphore or read/write key loses every holder at once and the
	// store returns one (C2 #ct2-multi): this server's other holders of the
	// key are checked against the store.
	s.recheckHolders(req.Key, lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED)
	return &lockdv1.RevokeResponse{Revoked: true, SessionId: string(g.Session), Token: g.Token}, nil
}

// SetValue implements the SetValue RPC: the holder replaces its grant's
// value (C2 #ct2-holder). The grant and its token never change.
func (s service) SetValue(ctx context.Context, req *lockdv1.SetValueRequest) (*lockdv1.SetValueResponse, error) {
	id := store.SessionID(req.SessionId)
	err := validGrantRef(id, req.Key, req.Token)
	if err == nil && store.ValidateValue(req.Value) != nil {
		err = invalid("value", store.ValidateValue(req.Value))
	}
	if err == nil {
		err = s.checkSecret(ctx, "SetValue", id, req.SessionSecret)
	}
	if err != nil {
		return nil, s.toStatus(ctx, "SetValue", err)
	}
	if err := s.st.SetValue(ctx, id, req.Key, req.Token, req.Value); err != nil {
		return nil, s.toStatus(ctx, "SetValue", fmt.Errorf("set value: %w", err))
	}
	return &lockdv1.SetValueResponse{}, nil
}

// beginAcquire makes the checks every Acquire makes before its session is
// used — the request's own (checked, already made), the drain (drain.go),
// the session secret — and pins the session for the call with a read begun
// (sessions.Table.PinUse): a grant that goes meanwhile is not tracked. The
// caller defers endAcquire(r) when err is nil.
func (s service) beginAcquire(ctx context.Context, id store.SessionID, secret []byte, checked error) (*sessions.Record, error) {
	if checked != nil {
		return nil, checked
	}
	if err := s.refuseWhileStopping(); err != nil {
		return nil, err
	}
	if err := s.checkSecret(ctx, "Acquire", id, secret); err != nil {
		return nil, err
	}
	r, ending := s.sess.PinUse(id)
	if ending {
		s.endAcquire(r)
		return nil, fmt.Errorf("acquire: %w", store.ErrSessionDead)
	}
	return r, nil
}

// endAcquire ends what beginAcquire began: the read, then the pin.
func (s service) endAcquire(r *sessions.Record) {
	s.sess.EndRead(r)
	s.sess.Unpin(r)
}
