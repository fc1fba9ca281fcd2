package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// errSlowConsumer ends a KeepAlive stream whose client stopped reading.
var errSlowConsumer = fmt.Errorf("%w: keepalive stream: client is not reading replies", errLimit)

// kaStream is the server side of one KeepAlive stream.
type kaStream struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	out    chan *lockdv1.KeepAliveResponse
	// sessions counts the sessions whose latest heartbeat came on this
	// stream (Server.mu).
	sessions int
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
	ctx, cancel := context.WithCancelCause(stream.Context())
	stopOnShutdown := context.AfterFunc(s.ctx, func() { cancel(errShuttingDown) })
	defer stopOnShutdown()
	ks := &kaStream{ctx: ctx, cancel: cancel, out: make(chan *lockdv1.KeepAliveResponse, 4*MaxInflightPerStream)}
	if !s.addStream(ks) { // drain.go: a draining replica takes no new stream
		cancel(errShuttingDown)
		return s.toStatus(stream.Context(), "KeepAlive", errShuttingDown)
	}
	defer s.removeStream(ks)

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
				if s.draining.Load() {
					r.Draining = true // every answer of a draining replica (C2 #ct2-drain)
				}
				if err := stream.Send(r); err != nil {
					cancel(err)
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
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				break loop
			}
			workers.Add(1)
			go func() { // exits when the heartbeat is answered or ctx ends
				defer workers.Done()
				defer func() { <-sem }()
				s.heartbeat(ctx, ks, req)
			}()
		}
	}
	workers.Wait()

	return s.streamEnd(stream.Context(), context.Cause(ctx))
}

// heartbeat answers one KeepAlive request. Every answer repeats the
// session's unacknowledged lock-lost notices, and every answer of a session
// whose grants the server knows lists them (held, C2 #ct2-confirm), read
// under the same lock as the trust it grants, after the store's answer: a
// grant the server has seen go is never listed afterwards.
func (s *Server) heartbeat(ctx context.Context, ks *kaStream, req *lockdv1.KeepAliveRequest) {
	recv := time.Now()
	resp := &lockdv1.KeepAliveResponse{SessionId: req.SessionId, RequestId: req.RequestId}
	if req.RequestId == 0 {
		resp.Error = s.sessionError(ctx, invalidf("request_id", "must be non-zero"))
		ks.push(resp)
		return
	}
	id := store.SessionID(req.SessionId)
	if store.ValidateSessionID(id) != nil {
		ks.push(resp) // no such session can exist: not live
		return
	}
	// A refused request attaches nothing, acknowledges nothing and extends
	// nothing (C2 #ct2-ownership).
	if err := s.checkSecret(ctx, "KeepAlive", id, req.SessionSecret); err != nil {
		if ctx.Err() == nil {
			resp.Error = s.sessionError(ctx, err)
			ks.push(resp)
		}
		return
	}
	ss, err := s.attach(id, ks, req.Ack)
	if err != nil {
		resp.Error = s.sessionError(ctx, err)
		ks.push(resp)
		return
	}
	defer s.unpin(ss)

	if s.drainAnswer(ctx, ss, resp) || s.isClosing(ss) {
		ks.push(resp)
		return
	}
	lv, err := s.liveness(ctx, ss) // liveness.go
	s.mu.Lock()
	switch {
	case ctx.Err() != nil:
		s.mu.Unlock()
		return // the stream is gone: nobody to answer
	case err == nil && lv.Live:
		if s.grantTrustLocked(ss, recv, lv.Remaining) {
			resp.Live = true
			resp.RemainingMs = max(lv.Remaining, 0).Milliseconds()
			resp.Held = s.heldLocked(ss)
		}
	case err == nil || errors.Is(err, store.ErrSessionDead):
		s.markGoneLocked(ss)
	default:
		resp.Error = s.sessionError(ctx, err)
		resp.Live = true // not meaningful with an error; never read as dead
		resp.Held = s.heldLocked(ss)
	}
	resp.Lost = s.pendingLocked(ss)
	s.mu.Unlock()
	ks.push(resp)
}

// seed fills the record of a session this server did not open (adopted:
// PostgreSQL sessions are usable from any replica and survive a lockd
// restart) with its grants read from the store, once, so that answers can
// confirm them. Over a store whose sessions every replica can use
// (store.SharedSessions) it reads them again before every answer: a grant
// or revoke through another replica changes them without this server
// seeing it, so its own record would list a revoked lock, or miss a lock
// granted elsewhere (C2 #ct2-confirm). A grant tracked before the read
// began that the store no longer has went away through another replica.
func (s *Server) seed(ctx context.Context, ss *session) error {
	s.mu.Lock()
	if ss.locks == nil || (ss.seeded && !s.sharedSessions) {
		s.mu.Unlock()
		return nil
	}
	before := maps.Clone(ss.locks)
	s.beginReadLocked(ss)
	s.mu.Unlock()
	grants, err := s.st.LocksOf(ctx, ss.id)
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.endReadLocked(ss)
	if err != nil || ss.locks == nil {
		return err
	}
	inStore := make(map[string]uint64, len(grants))
	for _, g := range grants {
		inStore[g.Key] = g.Token
	}
	for k, tok := range before {
		if inStore[k] != tok && ss.locks[k] == tok {
			s.goneLocked(ss, k, tok)
		}
	}
	for _, g := range grants {
		s.trackLocked(ss, g.Key, g.Token)
	}
	ss.seeded = true
	return nil
}

// drainAnswer fills resp for a session that a Shutdown with
// close-sessions-on-shutdown is about to close (SHUTTING_DOWN, no
// extension, its pending notices) and reports whether it did.
func (s *Server) drainAnswer(ctx context.Context, ss *session, resp *lockdv1.KeepAliveResponse) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ss.draining || ss.gone {
		return false
	}
	resp.Error = s.sessionError(ctx, errShuttingDown)
	resp.Live = true // not meaningful with an error
	resp.Held = s.heldLocked(ss)
	resp.Lost = s.pendingLocked(ss)
	return true
}

// attach pins the session's record, applies the client's acknowledgements
// and makes ks the stream its notices go to. It fails when ks already
// carries MaxSessionsPerStream sessions.
func (s *Server) attach(id store.SessionID, ks *kaStream, acks []uint64) (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[id]
	if ss == nil || ss.stream != ks {
		if ks.sessions >= MaxSessionsPerStream {
			return nil, fmt.Errorf("%w: at most %d sessions per keepalive stream", errLimit, MaxSessionsPerStream)
		}
	}
	if ss == nil {
		ss = &session{id: id, heapIdx: -1, locks: map[string]uint64{}}
		s.sessions[id] = ss
	}
	ss.pins++
	if ss.stream != ks {
		if ss.stream != nil {
			ss.stream.sessions--
		}
		ss.stream = ks
		ks.sessions++
	}
	s.ackLocked(ss, acks)
	return ss, nil
}

func (s *Server) isClosing(ss *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ss.closing || ss.gone || s.closingAll
}
