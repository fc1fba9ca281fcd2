package server

import (
	"context"
	"errors"
	"fmt"
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

// heartbeat answers one KeepAlive request.
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
	ss, pending, err := s.attach(id, ks)
	if err != nil {
		resp.Error = s.sessionError(ctx, err)
		ks.push(resp)
		return
	}
	defer s.unpin(ss)
	resp.Lost = pending

	if s.isClosing(ss) {
		ks.push(resp)
		return
	}
	lv, err := s.st.Heartbeat(ctx, id)
	switch {
	case ctx.Err() != nil:
		s.requeue(ss, pending)
		return // the stream is gone: nobody to answer
	case err == nil && lv.Live:
		if s.grantTrust(ss, recv, lv.Remaining) {
			resp.Live = true
			resp.RemainingMs = max(lv.Remaining, 0).Milliseconds()
		}
	case err == nil || errors.Is(err, store.ErrSessionDead):
		s.markGone(ss)
	default:
		resp.Error = s.sessionError(ctx, err)
		resp.Live = true // not meaningful with an error; never read as dead
	}
	if !ks.push(resp) {
		s.requeue(ss, pending)
	}
}

// attach pins the session's record and makes ks the stream its notices go
// to, returning the notices that waited for a stream. It fails when ks
// already carries MaxSessionsPerStream sessions.
func (s *Server) attach(id store.SessionID, ks *kaStream) (*session, []*lockdv1.LockLost, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[id]
	if ss == nil || ss.stream != ks {
		if ks.sessions >= MaxSessionsPerStream {
			return nil, nil, fmt.Errorf("%w: at most %d sessions per keepalive stream", errLimit, MaxSessionsPerStream)
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
	pending := ss.pending
	ss.pending = nil
	return ss, pending, nil
}

// requeue puts notices that could not be delivered back in front of the
// session's pending notices.
func (s *Server) requeue(ss *session, lost []*lockdv1.LockLost) {
	if len(lost) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.gone {
		return
	}
	ss.pending = append(lost, ss.pending...)
	if over := len(ss.pending) - maxPendingNotices; over > 0 {
		ss.pending = ss.pending[over:]
	}
}

func (s *Server) isClosing(ss *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ss.closing || ss.gone || s.closingAll
}
