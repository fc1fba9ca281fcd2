package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/testing/lockdtest"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// FuzzAPI sends arbitrary requests to every RPC of a real server over a real
// backend (embedded etcd). Whatever the input, the server must answer with a
// classified status — never panic, never Internal or Unknown (issue 6 §4).
// Seed corpus: testdata/fuzz/FuzzAPI.
func FuzzAPI(f *testing.F) {
	srv := lockdtest.StartBackend(f, backend.Etcd, lockdtest.Options{})
	api := dial(f, srv.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	real, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: time.Minute.Milliseconds()})
	cancel()
	if err != nil {
		f.Fatalf("OpenSession: %v", err)
	}

	f.Add(uint8(0), int64(15000), "", "k", uint64(0), false, int64(0), int32(0), false)
	f.Add(uint8(1), int64(0), "", "jobs/a", uint64(1), true, int64(10), int32(0), true)
	f.Add(uint8(2), int64(0), "nosuch", "jobs/a", uint64(7), false, int64(0), int32(0), true)
	f.Add(uint8(3), int64(0), "", "", uint64(0), false, int64(-5), int32(-1), false)
	f.Add(uint8(4), int64(0), "", "jobs/", uint64(0), false, int64(0), int32(5000), false)
	f.Add(uint8(5), int64(0), "", strings.Repeat("x", 600), uint64(0), false, int64(0), int32(0), false)
	f.Add(uint8(6), int64(0), "", "a\x00b", uint64(0), false, int64(0), int32(0), true)
	f.Add(uint8(7), int64(1<<62), "", "w/", uint64(0), true, int64(1<<62), int32(1), true)
	f.Add(uint8(8), int64(0), "", "k", uint64(0), false, int64(0), int32(0), true)
	f.Add(uint8(9), int64(0), "", "k", uint64(3), false, int64(0), int32(0), true)

	f.Fuzz(func(t *testing.T, rpc uint8, ttlMs int64, sid, key string, token uint64, wait bool, timeoutMs int64, limit int32, useReal bool) {
		// Protobuf refuses to encode invalid UTF-8 on the client side; the
		// server never sees it, so there is nothing to fuzz there.
		sid, key = strings.ToValidUTF8(sid, "?"), strings.ToValidUTF8(key, "?")
		if useReal {
			sid = real.SessionId
		}
		// Keep waits short so each input runs quickly.
		if timeoutMs > 50 {
			timeoutMs = 50
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		switch rpc % 10 {
		case 0:
			var r *lockdv1.OpenSessionResponse
			if r, err = api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: ttlMs}); err == nil {
				_, err = api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: r.SessionId})
			}
		case 1:
			_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: key, Wait: wait, WaitTimeoutMs: timeoutMs})
		case 2:
			_, err = api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: sid, Key: key, Token: token})
		case 3:
			_, err = api.Inspect(ctx, &lockdv1.InspectRequest{Key: key})
		case 4:
			_, err = api.List(ctx, &lockdv1.ListRequest{Prefix: key, PageToken: sid, Limit: limit})
		case 5:
			_, err = api.Revoke(ctx, &lockdv1.RevokeRequest{Key: key})
		case 6:
			if !useReal { // closing the shared session would only test ErrSessionDead from then on
				_, err = api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: sid})
			}
		case 7:
			var ws lockdv1.LockService_WatchClient
			wctx, wcancel := context.WithTimeout(ctx, 100*time.Millisecond)
			if ws, err = api.Watch(wctx, &lockdv1.WatchRequest{Prefix: key}); err == nil {
				_, err = ws.Recv()
			}
			wcancel()
			if status.Code(err) == codes.DeadlineExceeded {
				err = nil // an established watch with nothing to report
			}
		case 8:
			var ka lockdv1.LockService_KeepAliveClient
			if ka, err = api.KeepAlive(ctx); err == nil {
				if err = ka.Send(&lockdv1.KeepAliveRequest{SessionId: sid, RequestId: token}); err == nil {
					var resp *lockdv1.KeepAliveResponse
					if resp, err = ka.Recv(); err == nil && resp.Error != nil {
						if c := codes.Code(resp.Error.Code); c == codes.Internal || c == codes.Unknown {
							t.Fatalf("KeepAlive(%q): per-session error %v %q", sid, c, resp.Error.Message)
						}
					}
				}
				_ = ka.CloseSend()
			}
		case 9:
			_, err = api.Heartbeat(ctx, &lockdv1.HeartbeatRequest{SessionId: sid, Ack: []uint64{token}})
		}
		switch status.Code(err) {
		case codes.Internal, codes.Unknown:
			t.Fatalf("rpc %d (sid %q, key %q, token %d, ttl %d, wait %v/%dms, limit %d): %v",
				rpc%10, sid, key, token, ttlMs, wait, timeoutMs, limit, err)
		}
	})
}
