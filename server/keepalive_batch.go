package server

import (
	"context"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// Batched KeepAlive requests (C2 #ct2-keepalive-batch, issue 24): the
// heartbeats of several sessions in one message, each entry handled exactly
// as the same request sent alone (heartbeat), the answers sent back together
// in KeepAliveResponse.batch.

const (
	// batchFlush is how long the answers of a batch that are ready wait
	// for its slower entries before they go without them.
	batchFlush = 50 * time.Millisecond
	// maxBatchAnswerBytes bounds one batch answer message (encoded); an
	// answer over it alone goes alone.
	maxBatchAnswerBytes = 1 << 20
)

// batchInvalid reports why a batched request is refused as a whole, or nil.
func batchInvalid(req *lockdv1.KeepAliveRequest) error {
	if n := len(req.Batch); n > MaxKeepAliveBatch {
		return invalidf("batch", "keepalive batch of %d entries: at most %d", n, MaxKeepAliveBatch)
	}
	if req.SessionId != "" || req.RequestId != 0 || len(req.Ack) > 0 || len(req.SessionSecret) > 0 {
		return invalidf("batch", "a batched keepalive request carries its heartbeats only in batch")
	}
	return nil
}

// beatBatch starts the entries of the batched request req, each on a
// goroutine of its own holding one slot of sem (the in-flight bound of the
// stream), and a collector that sends their answers back together. It
// returns false when ctx ended before every entry was started (the entries
// not started are not answered: the stream is ending).
func (s *Server) beatBatch(ctx context.Context, ks *kaStream, req *lockdv1.KeepAliveRequest, sem chan struct{},
	workers *sync.WaitGroup) bool {
	if err := batchInvalid(req); err != nil {
		serr := s.sessionError(ctx, err)
		out := make([]*lockdv1.KeepAliveResponse, 0, len(req.Batch)+1)
		if req.RequestId != 0 {
			out = append(out, &lockdv1.KeepAliveResponse{SessionId: req.SessionId, RequestId: req.RequestId, Error: serr})
		}
		for _, e := range req.Batch {
			out = append(out, &lockdv1.KeepAliveResponse{SessionId: e.SessionId, RequestId: e.RequestId, Error: serr})
		}
		s.answerBatch(ks, out)
		return true
	}
	answers := make(chan *lockdv1.KeepAliveResponse, len(req.Batch))
	g := s.newHBGroup(len(req.Batch))
	started := 0
	for _, e := range req.Batch {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return false // the collector below is not started: nothing is sent on an ending stream
		}
		started++
		workers.Add(1)
		m := &hbMember{g: g}
		go func() { // exits when the entry is answered or ctx ends
			defer workers.Done()
			defer func() { <-sem }()
			r := s.heartbeat(ctx, ks, e, m)
			m.leave()    // it asks the store no more: the others need not wait for it
			answers <- r // buffered for every entry: never blocks
		}()
	}
	g.leaveAll(len(req.Batch) - started) // entries never started (ctx ended)
	workers.Add(1)
	go func() { // exits once every entry started has answered (or given up: ctx ended)
		defer workers.Done()
		s.collectBatch(ks, answers, started)
	}()
	return true
}

// collectBatch receives the n answers of a batch's entries (nil: the entry
// gave up, ctx ended) and sends them when all are in, or those ready
// batchFlush after the first of them was, then the rest as they come.
func (s *Server) collectBatch(ks *kaStream, answers <-chan *lockdv1.KeepAliveResponse, n int) {
	var ready []*lockdv1.KeepAliveResponse
	var flush *time.Timer
	var flushC <-chan time.Time
	defer func() {
		if flush != nil {
			flush.Stop()
		}
	}()
	for n > 0 {
		select {
		case r := <-answers:
			n--
			if r == nil {
				continue
			}
			ready = append(ready, r)
			if flushC == nil && n > 0 {
				flush = time.NewTimer(batchFlush)
				flushC = flush.C
			}
		case <-flushC:
			s.answerBatch(ks, ready)
			ready, flushC = nil, nil
		}
	}
	s.answerBatch(ks, ready)
}

// answerBatch sends answers in batch messages of at most
// maxBatchAnswerBytes each (at least one answer each).
func (s *Server) answerBatch(ks *kaStream, answers []*lockdv1.KeepAliveResponse) {
	for len(answers) > 0 {
		n, size := 1, proto.Size(answers[0])
		for n < len(answers) {
			sz := proto.Size(answers[n]) + 8 // the entry's tag and length
			if size+sz > maxBatchAnswerBytes {
				break
			}
			size += sz
			n++
		}
		s.answer(ks, &lockdv1.KeepAliveResponse{Batch: answers[:n:n]})
		answers = answers[n:]
	}
}

// hbGroup lets the entries of one batched request that reach the store's
// heartbeat together renew in one HeartbeatMany call (C2
// #ct2-heartbeat-many): the first to arrive waits until every entry has
// arrived or left (refused before the store, or answered without it), at
// most batchFlush, then asks the store for all that arrived; an entry
// arriving after that asks alone. Without a HeartbeatBatcher every entry
// asks alone.
type hbGroup struct {
	hb store.HeartbeatBatcher // nil: the store has none

	mu      sync.Mutex
	left    int // entries that may still arrive
	ids     []store.SessionID
	started bool          // the call for ids was made (later arrivals ask alone)
	all     chan struct{} // closed when left reaches 0
	done    chan struct{} // closed when lvs and errs are set
	lvs     []store.Liveness
	errs    []error
}

func (s *Server) newHBGroup(n int) *hbGroup {
	hb, _ := s.st.(store.HeartbeatBatcher)
	return &hbGroup{hb: hb, left: n, all: make(chan struct{}), done: make(chan struct{})}
}

// leaveAll records that n entries will not arrive.
func (g *hbGroup) leaveAll(n int) {
	if n == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		return
	}
	g.left -= n
	if g.left == 0 {
		close(g.all)
	}
}

// hbMember is one entry's place in its batch's hbGroup (nil: a request
// sent alone, or a Heartbeat call).
type hbMember struct {
	g    *hbGroup
	used bool // arrived (asked the store), or left
}

// leave records that the entry asks the store no more (once).
func (m *hbMember) leave() {
	if m == nil || m.used {
		return
	}
	m.used = true
	m.g.leaveAll(1)
}

// heartbeat is st.Heartbeat of id, with the batch's other entries where
// st can (see hbGroup).
func (m *hbMember) heartbeat(ctx context.Context, st store.LockStore, id store.SessionID) (store.Liveness, error) {
	if m == nil || m.used || m.g.hb == nil {
		m.leave()
		return st.Heartbeat(ctx, id)
	}
	m.used = true
	g := m.g
	g.mu.Lock()
	if g.started {
		g.mu.Unlock()
		return st.Heartbeat(ctx, id) // too late for the group's call
	}
	i := len(g.ids)
	g.ids = append(g.ids, id)
	g.left--
	if g.left == 0 {
		close(g.all)
	}
	g.mu.Unlock()
	if i > 0 {
		<-g.done // the first arrival's call always ends: it runs under the stream's ctx, as this one
		return g.lvs[i], g.errs[i]
	}
	t := time.NewTimer(batchFlush)
	select {
	case <-g.all:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	g.mu.Lock()
	g.started = true
	ids := g.ids
	g.mu.Unlock()
	g.lvs, g.errs = g.hb.HeartbeatMany(ctx, ids)
	close(g.done)
	return g.lvs[0], g.errs[0]
}

// refusedOrDeadAll is refusedOrDead for a message that may be a batch: of
// a batch, whether every answer in it is.
func refusedOrDeadAll(resp *lockdv1.KeepAliveResponse) bool {
	if len(resp.Batch) == 0 {
		return refusedOrDead(resp)
	}
	for _, r := range resp.Batch {
		if !refusedOrDead(r) {
			return false
		}
	}
	return true
}
