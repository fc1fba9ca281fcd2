package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/server"
)

// batchAnswers reads a KeepAlive stream until it has the answers of n
// request ids, and returns them by request id. Every message must advertise
// batch_max, and every answer must come in a batch message (KeepAliveResponse.batch).
func batchAnswers(t *testing.T, stream lockdv1.LockService_KeepAliveClient, n int) map[uint64]*lockdv1.KeepAliveResponse {
	t.Helper()
	got := map[uint64]*lockdv1.KeepAliveResponse{}
	for len(got) < n {
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("KeepAlive recv after %d of %d answers: %v", len(got), n, err)
		}
		if r.GetBatchMax() != server.MaxKeepAliveBatch {
			t.Fatalf("KeepAlive message with batch_max %d; want %d in every message", r.GetBatchMax(), server.MaxKeepAliveBatch)
		}
		if r.GetRequestId() != 0 {
			t.Fatalf("an answer outside a batch message: %v; want every answer to a batched request in KeepAliveResponse.batch", r)
		}
		for _, a := range r.GetBatch() {
			if _, dup := got[a.GetRequestId()]; dup {
				t.Fatalf("request %d answered twice", a.GetRequestId())
			}
			got[a.GetRequestId()] = a
		}
	}
	return got
}

// TestKeepAliveBatch: the heartbeats of several sessions in one KeepAlive
// message are answered per session, exactly as sent alone (C2
// #ct2-keepalive-batch): the good entries live with remaining_ms and their
// held sets, a wrong secret refused alone (SESSION_SECRET_MISMATCH), a
// closed session not live, a request_id 0 invalid, none spoiling the
// others; a batch over the bound is refused entry by entry, and the
// stream goes on. The old server answered the batch message as one request
// with request_id 0 ("an answer outside a batch message: ... request_id
// must be non-zero").
func TestKeepAliveBatch(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
		ctx := testCtx(t, time.Minute)
		api := dialBare(t, srv.Addr)

		const good = 4
		var opens []*lockdv1.OpenSessionResponse
		for range good + 2 {
			opens = append(opens, openRaw(t, ctx, api, longTTL))
		}
		g, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: opens[0].SessionId, SessionSecret: opens[0].SessionSecret, Key: "k"})
		if err != nil || !g.Granted {
			t.Fatalf("Acquire(k) = %v, %v", g, err)
		}
		closed := opens[good+1]
		if _, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: closed.SessionId, SessionSecret: closed.SessionSecret}); err != nil {
			t.Fatalf("CloseSession: %v", err)
		}

		stream, err := api.KeepAlive(ctx)
		if err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		var batch []*lockdv1.KeepAliveRequest
		for i := range good {
			batch = append(batch, &lockdv1.KeepAliveRequest{SessionId: opens[i].SessionId, SessionSecret: opens[i].SessionSecret, RequestId: uint64(i + 1)})
		}
		wrong := opens[good]
		batch = append(batch,
			&lockdv1.KeepAliveRequest{SessionId: wrong.SessionId, SessionSecret: make([]byte, 32), RequestId: 100},
			&lockdv1.KeepAliveRequest{SessionId: closed.SessionId, SessionSecret: closed.SessionSecret, RequestId: 101},
			&lockdv1.KeepAliveRequest{SessionId: opens[1].SessionId, SessionSecret: opens[1].SessionSecret}, // request_id 0
		)
		if err := stream.Send(&lockdv1.KeepAliveRequest{Batch: batch}); err != nil {
			t.Fatalf("KeepAlive send: %v", err)
		}
		got := batchAnswers(t, stream, len(batch))
		for i := range good {
			a := got[uint64(i+1)]
			if a.GetSessionId() != opens[i].SessionId || !a.GetLive() || a.GetError() != nil || a.GetRemainingMs() <= 0 {
				t.Errorf("entry %d (%s) answered %v; want live with remaining_ms, no error", i+1, opens[i].SessionId, a)
			}
			if i == 0 && (len(a.GetHeld().GetLocks()) != 1 || a.GetHeld().GetLocks()[0].GetKey() != "k" || a.GetHeld().GetLocks()[0].GetToken() != g.Token) {
				t.Errorf("entry 1 held = %v; want k token %d", a.GetHeld(), g.Token)
			}
		}
		if a := got[100]; a.GetSessionId() != wrong.SessionId || a.GetRemainingMs() != 0 || a.GetHeld() != nil ||
			codes.Code(a.GetError().GetCode()) != codes.PermissionDenied || a.GetError().GetReason() != wireerr.ReasonSessionSecretMismatch {
			t.Errorf("entry with a wrong secret answered %v; want PERMISSION_DENIED %s alone", a, wireerr.ReasonSessionSecretMismatch)
		}
		if a := got[101]; a.GetSessionId() != closed.SessionId || a.GetLive() || a.GetError() != nil {
			t.Errorf("entry of a closed session answered %v; want live = false, no error", a)
		}
		if a := got[0]; codes.Code(a.GetError().GetCode()) != codes.InvalidArgument || a.GetRemainingMs() != 0 {
			t.Errorf("entry with request_id 0 answered %v; want INVALID_ARGUMENT", a)
		}

		// Over the bound: refused entry by entry, nothing extended; the
		// stream goes on.
		var over []*lockdv1.KeepAliveRequest
		for i := range server.MaxKeepAliveBatch + 1 {
			over = append(over, &lockdv1.KeepAliveRequest{SessionId: opens[1].SessionId, SessionSecret: opens[1].SessionSecret, RequestId: uint64(1000 + i)})
		}
		if err := stream.Send(&lockdv1.KeepAliveRequest{Batch: over}); err != nil {
			t.Fatalf("KeepAlive send: %v", err)
		}
		want := fmt.Sprintf("keepalive batch of %d entries: at most %d", server.MaxKeepAliveBatch+1, server.MaxKeepAliveBatch)
		for id, a := range batchAnswers(t, stream, len(over)) {
			if codes.Code(a.GetError().GetCode()) != codes.InvalidArgument || a.GetError().GetReason() != wireerr.ReasonInvalidArgument ||
				!strings.Contains(a.GetError().GetMessage(), want) || a.GetRemainingMs() != 0 || a.GetLive() {
				t.Fatalf("entry %d of an oversized batch answered %v; want INVALID_ARGUMENT %q", id, a, want)
			}
		}
		if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: opens[2].SessionId, SessionSecret: opens[2].SessionSecret, RequestId: 7}); err != nil {
			t.Fatalf("KeepAlive send: %v", err)
		}
		for {
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("KeepAlive recv after the oversized batch: %v", err)
			}
			if r.GetRequestId() == 7 {
				if !r.GetLive() || r.GetError() != nil || r.GetBatchMax() != server.MaxKeepAliveBatch {
					t.Fatalf("single heartbeat after the oversized batch = %v; want live with batch_max", r)
				}
				break
			}
		}
	})
}

// BenchmarkKeepAliveBatchRounds sends the heartbeats of 64 sessions on one
// KeepAlive stream as 64 requests (single) or one batched request (batch)
// per iteration, on PostgreSQL, and reports how many heartbeats shared each
// of the store's renewal statements (lockd_backend_batch_size{batch=
// "heartbeats"}): a batch's entries reach the group commit together (C2
// #ct2-keepalive-batch). No assertion: the figure depends on scheduling.
//
//	go test -run '^$' -bench KeepAliveBatchRounds -benchtime 20x ./server/
func BenchmarkKeepAliveBatchRounds(b *testing.B) {
	for _, mode := range []string{"single", "batch"} {
		b.Run(mode, func(b *testing.B) {
			srv := lockdtest.StartBackend(b, "pg", lockdtest.Options{NoClient: true})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			api := dialBare(b, srv.Addr)
			const n = server.MaxKeepAliveBatch
			var opens []*lockdv1.OpenSessionResponse
			for range n {
				o, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: longTTL.Milliseconds()})
				if err != nil {
					b.Fatalf("OpenSession: %v", err)
				}
				opens = append(opens, o)
			}
			stream, err := api.KeepAlive(ctx)
			if err != nil {
				b.Fatalf("KeepAlive: %v", err)
			}
			rounds := func() (count, sum float64) {
				fams, err := srv.Registry.Gather()
				if err != nil {
					b.Fatalf("Gather: %v", err)
				}
				for _, f := range fams {
					if f.GetName() != "lockd_backend_batch_size" {
						continue
					}
					for _, m := range f.GetMetric() {
						for _, l := range m.GetLabel() {
							if l.GetValue() == "heartbeats" {
								return float64(m.GetHistogram().GetSampleCount()), m.GetHistogram().GetSampleSum()
							}
						}
					}
				}
				return 0, 0
			}
			id := uint64(0)
			c0, s0 := rounds()
			b.ResetTimer()
			for range b.N {
				reqs := make([]*lockdv1.KeepAliveRequest, 0, n)
				for _, o := range opens {
					id++
					reqs = append(reqs, &lockdv1.KeepAliveRequest{SessionId: o.SessionId, SessionSecret: o.SessionSecret, RequestId: id})
				}
				msgs := reqs
				if mode == "batch" {
					msgs = []*lockdv1.KeepAliveRequest{{Batch: reqs}}
				}
				for _, m := range msgs {
					if err := stream.Send(m); err != nil {
						b.Fatalf("KeepAlive send: %v", err)
					}
				}
				for got := 0; got < n; {
					r, err := stream.Recv()
					if err != nil {
						b.Fatalf("KeepAlive recv: %v", err)
					}
					if r.GetRequestId() != 0 {
						got++
					}
					got += len(r.GetBatch())
				}
			}
			b.StopTimer()
			c1, s1 := rounds()
			b.ReportMetric((s1-s0)/(c1-c0), "heartbeats/round")
			b.ReportMetric(0, "ns/op")
		})
	}
}
