package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/server/internal/sessions"
	"lock.dev/lockd/store"
)

// errSlowConsumer ends a KeepAlive stream whose client stopped reading.
var errSlowConsumer = fmt.Errorf("%w: keepalive stream: client is not reading replies", errLimit)

// errNoLiveSession ends a KeepAlive stream that carries no live session of
// its caller (C2 #ct2-ownership, issue 23 F2).
var errNoLiveSession = errors.New("keepalive stream carries no live session of its caller")

// kaStream is the server side of one KeepAlive stream.
type kaStream struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	out    chan *lockdv1.KeepAliveResponse
	// reg is the stream in the session table's registry (the sessions
	// whose notices go to it).
	reg *sessions.Stream
	// endAfter is the last answer that named no live session of the
	// caller while the stream carried none: once it is sent, the stream
	// ends if it still carries none (errNoLiveSession).
	endAfter atomic.Pointer[lockdv1.KeepAliveResponse]
}

// refusedOrDead reports whether resp answers a request naming no live
// session of its caller: not live, or refused for access (C2
// #ct2-ownership). A transient error is neither.
func refusedOrDead(resp *lockdv1.KeepAliveResponse) bool {
	if resp.Error == nil {
		return !resp.Live
	}
	return slices.Contains([]string{wireerr.ReasonSessionDead, wireerr.ReasonSessionSecretRequired,
		wireerr.ReasonSessionSecretMismatch, wireerr.ReasonSessionPrincipalMismatch}, resp.Error.Reason)
}

// answer queues resp, and marks the stream to end after it when it names
// no live session of the caller and the stream carries none (a batch
// message: when none of its answers does).
func (s *Server) answer(ks *kaStream, resp *lockdv1.KeepAliveResponse) {
	if refusedOrDeadAll(resp) && s.sess.StreamSessions(ks.reg) == 0 {
		ks.endAfter.Store(resp)
	}
	ks.push(resp)
}

// push queues a reply without blocking. A client that does not read its
// replies has its stream ended (it reconnects); push then reports false.
func (k *kaStream) push(r *lockdv1.KeepAliveResponse) bool {
	if k.ctx.Err() != nil {
		return false
	}
	select {
	case k.out <- r:
		return true
	default:
		k.cancel(errSlowConsumer)
		return false
	}
}

// KeepAlive implements the KeepAlive RPC: heartbeats of many sessions on one
// stream. Each request is handled by a short-lived goroutine (at most
// MaxInflightPerStream at once per stream) that calls store.Heartbeat and
// queues the reply; one sender goroutine writes replies and notices.
func (s service) KeepAlive(stream lockdv1.LockService_KeepAliveServer) error {
	if err := s.refuseWhileStopping(); err != nil { // drain.go
		return s.toStatus(stream.Context(), "KeepAlive", err)
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	stopOnShutdown := context.AfterFunc(s.ctx, func() { cancel(errShuttingDown) })
	defer stopOnShutdown()
	ks := &kaStream{ctx: ctx, cancel: cancel, out: make(chan *lockdv1.KeepAliveResponse, 4*MaxInflightPerStream)}
	var ok bool
	if ks.reg, ok = s.sess.AddStream(ks.push); !ok { // a draining replica takes no new stream (drain.go)
		cancel(errShuttingDown)
		return s.toStatus(stream.Context(), "KeepAlive", errShuttingDown)
	}
	defer s.sess.RemoveStream(ks.reg)

	reqs := make(chan *lockdv1.KeepAliveRequest)
	// The receiver and the sender are owned by the Server (s.wg): they end
	// when the stream ends, which gRPC guarantees once this handler has
	// returned, and Shutdown waits for them.
	s.wg.Add(2)
	go func() { // exits when Recv fails (stream ended) or ctx ends
		defer s.wg.Done()
		for {
			req, err := stream.Recv()
			if err != nil {
				cancel(err)
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { // exits when ctx ends or a Send fails
		defer s.wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case r := <-ks.out:
				if s.sess.Draining() {
					r.Draining = true // every answer of a draining replica (C2 #ct2-drain)
					for _, e := range r.Batch {
						e.Draining = true
					}
				}
				r.BatchMax = MaxKeepAliveBatch // C2 #ct2-keepalive-batch
				if err := stream.Send(r); err != nil {
					cancel(err)
					return
				}
				if ks.endAfter.Load() == r && s.sess.StreamSessions(ks.reg) == 0 {
					cancel(errNoLiveSession) // sent what it named; nothing of its own is left on it
					return
				}
			}
		}
	}()

	var workers sync.WaitGroup
	sem := make(chan struct{}, MaxInflightPerStream)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case req := <-reqs:
			if len(req.Batch) > 0 { // keepalive_batch.go
				if !s.beatBatch(ctx, ks, req, sem, &workers) {
					break loop
				}
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				break loop
			}
			workers.Add(1)
			go func() { // exits when the heartbeat is answered or ctx ends
				defer workers.Done()
				defer func() { <-sem }()
				if resp := s.heartbeat(ctx, ks, req, nil); resp != nil {
					s.answer(ks, resp)
				}
			}()
		}
	}
	workers.Wait()

	return s.streamEnd(stream.Context(), context.Cause(ctx))
}

// heartbeat answers one KeepAlive request, alone or (m set) an entry of a
// batch (beat does the work): nil when ctx ended and nobody is left to
// answer.
func (s *Server) heartbeat(ctx context.Context, ks *kaStream, req *lockdv1.KeepAliveRequest, m *hbMember) *lockdv1.KeepAliveResponse {
	resp := &lockdv1.KeepAliveResponse{SessionId: req.SessionId, RequestId: req.RequestId}
	if req.RequestId == 0 {
		resp.Error = s.sessionError(ctx, invalidf("request_id", "must be non-zero"))
		return resp
	}
	if len(req.Batch) > 0 { // an entry of a batch with a batch of its own (C2 #ct2-keepalive-batch)
		resp.Error = s.sessionError(ctx, invalidf("batch", "an entry of a batch carries no batch"))
		return resp
	}
	id := store.SessionID(req.SessionId)
	if store.ValidateSessionID(id) != nil {
		return resp // no such session can exist: not live
	}
	answer, err := s.beat(ctx, "KeepAlive", ks, id, req.SessionSecret, req.Ack, resp, m)
	if !answer {
		return nil
	}
	if err != nil {
		resp.Error = s.sessionError(ctx, err)
	}
	return resp
}

// beat is one heartbeat of session id, received on the KeepAlive stream ks
// or, with ks nil, as a Heartbeat call (which attaches the session to no
// stream). It fills resp and returns the error that answers it instead of
// a plain answer (resp then carries what such an answer also carries), or
// answer = false when ctx ended and nobody is left to answer. Every answer
// repeats the session's unacknowledged lock-lost notices, and every answer
// of a session whose grants the server knows lists them (held, C2
// #ct2-confirm), read under the same lock as the trust it grants, after
// the store's answer: a grant the server has seen go is never listed
// afterwards. An entry of a batched request (m set) asks the store with the
// batch's other entries (keepalive_batch.go).
func (s *Server) beat(ctx context.Context, method string, ks *kaStream, id store.SessionID, secret []byte, acks []uint64,
	resp *lockdv1.KeepAliveResponse, m *hbMember) (answer bool, err error) {
	recv := time.Now()
	// A refused request attaches nothing, acknowledges nothing and extends
	// nothing (C2 #ct2-ownership).
	if err := s.checkSecret(ctx, method, id, secret); err != nil {
		return ctx.Err() == nil, err
	}
	var reg *sessions.Stream
	if ks != nil {
		reg = ks.reg
	}
	r, err := s.sess.Attach(id, reg, acks)
	if err != nil { // sessions.ErrStreamFull
		return true, fmt.Errorf("%w: at most %d sessions per keepalive stream", errLimit, MaxSessionsPerStream)
	}
	defer s.sess.Unpin(r)

	if s.sess.DrainAnswer(r, resp) {
		return true, errShuttingDown
	}
	if s.sess.Ending(r) {
		// A shutdown's CloseAll may have moved it to Draining after
		// DrainAnswer looked: its answer is then SHUTTING_DOWN with the
		// pending notices, never dead (the client would end the session
		// without acknowledging them; issue 21).
		if s.sess.DrainAnswer(r, resp) {
			return true, errShuttingDown
		}
		return true, nil
	}
	mark := s.sess.CloseMark(r)
	lv, err := s.liveness(ctx, r, m) // liveness.go
	answer, err = s.sess.Beat(ctx, r, mark, recv, lv, err, resp)
	if errors.Is(err, sessions.ErrDraining) {
		err = errShuttingDown
	}
	return answer, err
}

// Heartbeat implements the Heartbeat RPC: one KeepAlive request as a unary
// call (the HTTP/JSON API's keepalive, C2 #ct2-http). The answer is the
// one a KeepAlive request gets, without request_id; an error of that
// answer is the call's error.
func (s service) Heartbeat(ctx context.Context, req *lockdv1.HeartbeatRequest) (*lockdv1.HeartbeatResponse, error) {
	id := store.SessionID(req.SessionId)
	if err := store.ValidateSessionID(id); err != nil {
		return nil, s.toStatus(ctx, "Heartbeat", invalid("session_id", err))
	}
	resp := &lockdv1.KeepAliveResponse{SessionId: req.SessionId}
	answer, err := s.beat(ctx, "Heartbeat", nil, id, req.SessionSecret, req.Ack, resp, nil)
	switch {
	case err != nil:
		return nil, s.toStatus(ctx, "Heartbeat", err)
	case !answer:
		return nil, s.toStatus(ctx, "Heartbeat", context.Cause(ctx))
	}
	return &lockdv1.HeartbeatResponse{Live: resp.Live, RemainingMs: resp.RemainingMs, Held: resp.Held, Lost: resp.Lost,
		Draining: resp.Draining}, nil
}
