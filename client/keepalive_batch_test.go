package client_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// beatsOnWire opens n sessions of one client at n instants and returns the
// KeepAliveRequest messages (heartbeats in each) and the sessions heard
// from over two intervals once each has sent a heartbeat (the grid of
// TestHeartbeatsLeaveTogether: they leave in one wake-up per interval).
func beatsOnWire(t *testing.T, backend string, n int, more ...grpc.StreamClientInterceptor) (msgs []int, sessions int) {
	t.Helper()
	d, from, to := openOnGrid(t, backend, n, more...)
	_, per := d.log.within(from, to, nil)
	return d.log.messages(from, to), len(per)
}

// TestHeartbeatsOneMessage (issue 24, C2 #ct2-keepalive-batch): 20
// sessions of one client whose heartbeats leave in one wake-up leave in one
// KeepAlive message per wake-up, counted on the wire by a stream
// interceptor, and every one of them is answered (the driver's settle
// waits for it). Before, each went as a message of its own:
//
//	20 sessions sent 40 heartbeats in 40 messages over two intervals ([1 1 1 1 1 1]); want 2 messages of 20
func TestHeartbeatsOneMessage(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		const n = 20
		msgs, sessions := beatsOnWire(t, backend, n)
		if len(msgs) != 2 || msgs[0] != n || msgs[1] != n || sessions != n {
			t.Fatalf("%d sessions sent %d heartbeats in %d messages over two intervals (%v); want 2 messages of %d",
				n, sessions, len(msgs), msgs[:min(len(msgs), 6)], n)
		}
	})
}

// TestHeartbeatsOneEachWithoutBatchMax: a stream whose server does not
// advertise batch_max (an older server; here the replies are stripped of
// it) is sent one request per heartbeat, and every one is answered.
func TestHeartbeatsOneEachWithoutBatchMax(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		const n = 5
		strip := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
			streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil || method != lockdv1.LockService_KeepAlive_FullMethodName {
				return cs, err
			}
			return stripBatchMax{cs}, nil
		}
		msgs, sessions := beatsOnWire(t, backend, n, strip)
		if len(msgs) != 2*n || sessions != n {
			t.Fatalf("%d sessions sent heartbeats in %d messages over two intervals (%v) without batch_max; want %d of one each",
				sessions, len(msgs), msgs[:min(len(msgs), 6)], 2*n)
		}
		for _, m := range msgs {
			if m != 1 {
				t.Fatalf("a message of %d heartbeats to a server that did not advertise batch_max", m)
			}
		}
	})
}

// stripBatchMax removes batch_max from the KeepAlive replies it receives.
type stripBatchMax struct{ grpc.ClientStream }

func (s stripBatchMax) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*lockdv1.KeepAliveResponse); ok && err == nil {
		r.BatchMax = 0
	}
	return err
}

// TestBatchDeadlineFromSendTime (C2 #ct2-keepalive-batch, docs/safety.md
// rule 1): two sessions whose heartbeats leave in one batched message each
// count their trust from that message's send time, not from when the
// answers arrived. The store moves the SDK's fake clock rtt while it renews
// (a Faulty During hook), and each session's deadline is exactly send +
// Remaining − margin. An SDK built with -tags lockd_recvtime_control fails
// it.
func TestBatchDeadlineFromSendTime(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		const (
			interval = 20 * time.Second
			rtt      = time.Second // how far the clock moves while the batch is at the server
			rem      = 30 * time.Second
		)
		var faulty *lockdtest.Faulty
		clock := &alarmClock{fakeClock: newFakeClock()}
		// The During hook below moves the clock while the batch is at the
		// server: the driver check must not take that for a lapse.
		log := &beatLog{clock: clock, movesInFlight: true}
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{
			// A long real TTL: heartbeats follow the fake clock.
			ClientOptions: []client.Option{client.WithClock(clock), client.WithHeartbeatInterval(interval),
				client.WithTTL(time.Minute), client.WithDialOptions(grpc.WithChainStreamInterceptor(log.interceptor))},
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		d := &beatDriver{t: t, clock: clock, log: log}
		// The grid's instants are t0 + 5s + n×20s (the client was made at
		// t0): the first session's heartbeat after its first (at once, on
		// the new stream) and the second session's first both come at
		// t0+5s, before the halfway rule would pull either.
		client.SetHeartbeatPhase(srv.Client, 0.25)
		ctx := testCtx(t, 60*time.Second)
		faulty.SetRemaining(rem)
		var sessions []*client.Session
		for i := range 2 {
			mark := clock.lastSeq()
			sessions = append(sessions, newSession(t, ctx, srv.Client))
			d.settle(mark, fmt.Sprintf("the keepaliver took session %d", i))
		}
		var once sync.Once
		faulty.During(telemetry.OpHeartbeat, func() { once.Do(func() { clock.Advance(rtt) }) })
		at, ok := clock.earliest()
		if !ok {
			t.Fatal("no heartbeat scheduled")
		}
		mark := clock.lastSeq()
		clock.Advance(at.Sub(clock.Now()))
		d.settle(mark, "the batched heartbeats answered")
		log.mu.Lock()
		last := log.msgs[len(log.msgs)-1]
		log.mu.Unlock()
		if last.entries != 2 {
			t.Fatalf("the last KeepAlive message carried %d heartbeats; want the 2 sessions' in one", last.entries)
		}
		if moved := clock.Now().Sub(last.at); moved < rtt {
			t.Fatalf("the clock moved %v while the batch was at the server; want %v (During hook)", moved, rtt)
		}
		want := last.at.Add(rem - lockdtest.SafetyMargin)
		for i, s := range sessions {
			if got := s.Deadline(); !got.Equal(want) {
				t.Errorf("session %d: deadline after the batch sent at %v and answered %v later = send%+v; want send%+v = send + Remaining − margin",
					i, last.at.Format("15:04:05.000"), clock.Now().Sub(last.at), got.Sub(last.at), want.Sub(last.at))
			}
		}
	})
}
