package client

import (
	"context"
	"io"
	"log/slog"
	"sort"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// armed reports whether a timer that has not fired is due at exactly at.
func (c *manualClock) armed(at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.timers {
		if !t.stopped && t.at.Equal(at) {
			return true
		}
	}
	return false
}

// shadowStream is the client side of a KeepAlive stream whose replica
// answers nothing: it records what is sent (only Send and Context are used
// on a shadow).
type shadowStream struct {
	lockdv1.LockService_KeepAliveClient
	ctx  context.Context
	sent chan *lockdv1.KeepAliveRequest
}

func (s *shadowStream) Send(r *lockdv1.KeepAliveRequest) error { s.sent <- r; return nil }
func (s *shadowStream) Context() context.Context               { return s.ctx }

// inFlight returns the request ids in flight on fl.
func inFlight(fl *flight) []uint64 {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	var ids []uint64
	for id := range fl.beats {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// TestStallMoveShadowForgetsUnanswered: on a stream left because it
// stalled and still sent heartbeats (C2 #ct2-failover, "a stall move keeps
// sending"), whose replica answers nothing at all, a heartbeat is forgotten
// a TTL after its send, as on any stream, and its session is then sent the
// next one there. Before, the stream's linger waited with no timer while
// nothing else was in flight and a shadow's send did not wake it, and the
// sends counted every heartbeat still recorded: the first unanswered one
// after the move was never forgotten, and the session was never sent
// another there:
//
//	a TTL after heartbeat 2 went unanswered on the stalled stream: in flight [2], want [3] (2 forgotten, the next sent)
//
// The keepaliver's own pieces run here (addShadow, sendShadows, linger) on
// a manual clock, with a stream that records its sends in place of a
// replica that answers nothing; client.TestStallMove* drive real replicas.
func TestStallMoveShadowForgetsUnanswered(t *testing.T) {
	const ttl, interval = 10 * time.Second, time.Second
	clock := &manualClock{now: time.Unix(1_000_000, 0)}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{clock: clock, log: slog.New(slog.NewTextHandler(io.Discard, nil)), ctx: ctx, cancel: cancel}
	k := newKeepaliver(c)
	c.ka = k
	t.Cleanup(func() { cancel(); c.wg.Wait() })
	s := &Session{c: c, id: "s1", ttl: ttl, interval: interval}
	due := []*kaEntry{{s: s}}

	// The stalled stream, with the heartbeat the stall was found on (1)
	// unanswered, becomes a shadow; its linger starts.
	sctx, scancel := context.WithCancel(ctx)
	st := &shadowStream{ctx: sctx, sent: make(chan *lockdv1.KeepAliveRequest, 16)}
	fl := &flight{beats: map[uint64]beat{1: {s: s, sent: clock.Now()}}, gen: 1, drain: make(chan struct{}),
		answered: make(chan struct{}, 1), gone: make(chan struct{}), lastRecv: clock.Now()}
	fl.left.Store(true)
	k.addShadow(st, fl, 1)
	recvDone := make(chan struct{})
	close(recvDone)
	c.wg.Add(1)
	go k.linger(ctx, fl, scancel, make(chan error), recvDone)
	t0 := clock.Now()
	if testkit.Poll(10*time.Second, func() bool { return clock.armed(t0.Add(ttl)) }) != nil {
		t.Fatal("the linger armed no timer to forget heartbeat 1 a TTL after its send")
	}
	sent := func(what string) *lockdv1.KeepAliveRequest {
		t.Helper()
		select {
		case r := <-st.sent:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: nothing sent on the stalled stream", what)
			return nil
		}
	}

	// One at a time: while 1 is in flight the session is not sent another.
	clock.advance(interval)
	k.sendShadows(due)
	if ids := inFlight(fl); len(ids) != 1 || ids[0] != 1 {
		t.Fatalf("a due heartbeat while 1 is unanswered on the stalled stream: in flight %v, want [1]", ids)
	}
	// A TTL after its send, 1 is forgotten (the linger's timer), and the
	// next due heartbeat is sent there: 2.
	clock.advance(ttl - interval)
	if testkit.Poll(10*time.Second, func() bool { return len(inFlight(fl)) == 0 }) != nil {
		t.Fatalf("heartbeat 1 not forgotten a TTL after its send: in flight %v", inFlight(fl))
	}
	k.sendShadows(due)
	if r := sent("the first due heartbeat after 1 was forgotten"); r.GetRequestId() != 2 || len(r.GetAck()) != 0 {
		t.Fatalf("sent on the stalled stream: request %d acks %v; want request 2 without acks", r.GetRequestId(), r.GetAck())
	}
	t2 := clock.Now()
	// 2 goes unanswered too, with nothing else in flight there: the linger
	// must still forget it a TTL after its send...
	if testkit.Poll(10*time.Second, func() bool { return clock.armed(t2.Add(ttl)) }) != nil {
		t.Errorf("the linger armed no timer to forget heartbeat 2 (sent on the stalled stream with nothing else in flight) a TTL after its send")
	}
	// ...and the session is sent the next heartbeat there.
	clock.advance(ttl)
	k.sendShadows(due)
	if ids := inFlight(fl); len(ids) != 1 || ids[0] != 3 {
		t.Fatalf("a TTL after heartbeat 2 went unanswered on the stalled stream: in flight %v, want [3] (2 forgotten, the next sent)", ids)
	}
	if r := sent("the due heartbeat a TTL after 2"); r.GetRequestId() != 3 {
		t.Fatalf("sent on the stalled stream: request %d; want 3", r.GetRequestId())
	}
}
