package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store"
)

// serverTestsAtOnce is the package's default -parallel: its tests mostly
// wait (TTLs, expiries, replicas' moves), about 0.45 of a core for the
// whole package in a clean-clone run (issue 21, CI time: 280 s of wall for
// 125 s of CPU), so four at once instead of GOMAXPROCS (two).
const serverTestsAtOnce = 4

func TestMain(m *testing.M) {
	testkit.DefaultParallel(serverTestsAtOnce)
	lockdtest.Main(m)
}

// forBackends runs f as a parallel subtest per backend, and makes the test
// that calls it parallel too, so that it runs beside the package's other
// such tests once the sequential ones have ended. A test whose own load
// would crowd the others' timing (a flood of sessions) uses
// forBackendsAlone.
func forBackends(t *testing.T, f func(t *testing.T, backend string)) {
	t.Helper()
	t.Parallel()
	forBackendsAlone(t, f)
}

// forBackendsAlone runs f as a parallel subtest per backend while the test
// that calls it stays sequential: no test of the package runs beside it
// but its own backends' subtests.
func forBackendsAlone(t *testing.T, f func(t *testing.T, backend string)) {
	t.Helper()
	for _, backend := range lockdtest.Backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			f(t, backend)
		})
	}
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// dial returns a raw gRPC client of srv, closed when the test ends. Like
// the SDK, it sends each session's secret (lockdtest.SessionSecrets); the
// tests of refusals use dialBare.
func dial(t testing.TB, addr string) lockdv1.LockServiceClient {
	t.Helper()
	return dialBare(t, addr, lockdtest.SessionSecrets()...)
}

// dialBare is dial without the session secrets.
func dialBare(t testing.TB, addr string, opts ...grpc.DialOption) lockdv1.LockServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return lockdv1.NewLockServiceClient(conn)
}

// reason returns the lockd ErrorInfo reason of a status error.
func reason(err error) string { return wireerr.Reason(status.Convert(err)) }

// longTTL is the TTL of sessions whose expiry is not the point of a test
// (raw ones nothing heartbeats, and SDK sessions that are only a vehicle
// for what the test checks): a loaded machine may starve the test process
// for seconds, and with lockdtest.TTL (3 s) such a session expires and
// fails a test about something else (issue 21). Sessions whose expiry,
// silence or heartbeat timing is the subject keep the short TTL.
const longTTL = time.Minute

// openRaw opens a session through the raw API (ttl 0: the server default).
func openRaw(t *testing.T, ctx context.Context, api lockdv1.LockServiceClient, ttl time.Duration) *lockdv1.OpenSessionResponse {
	t.Helper()
	resp, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: ttl.Milliseconds()})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	return resp
}

func TestOpenSessionAdvertises(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		cfg := lockdtest.Config()
		cfg.HeartbeatInterval = 700 * time.Millisecond
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Config: &cfg, NoClient: true})
		ctx := testCtx(t, 30*time.Second)
		api := dial(t, srv.Addr)
		resp := openRaw(t, ctx, api, 0) // the server's default TTL
		if resp.SessionId == "" || resp.TtlMs < lockdtest.TTL.Milliseconds() {
			t.Errorf("OpenSession = %v; want a session id and ttl_ms >= %d", resp, lockdtest.TTL.Milliseconds())
		}
		if resp.RemainingMs <= 0 || resp.RemainingMs > resp.TtlMs {
			t.Errorf("OpenSession remaining_ms = %d; want in (0, %d]", resp.RemainingMs, resp.TtlMs)
		}
		if resp.SafetyMarginMs != cfg.SafetyMargin.Milliseconds() || resp.HeartbeatIntervalMs != 700 {
			t.Errorf("OpenSession advertises margin %dms, interval %dms; want %dms, 700ms",
				resp.SafetyMarginMs, resp.HeartbeatIntervalMs, cfg.SafetyMargin.Milliseconds())
		}
		// A longer session: the configured interval still fits it.
		long, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: 9000})
		if err != nil {
			t.Fatalf("OpenSession(ttl 9s): %v", err)
		}
		if long.TtlMs != 9000 || long.HeartbeatIntervalMs != 700 {
			t.Errorf("OpenSession(ttl 9s) = ttl %d, interval %d; want 9000, 700", long.TtlMs, long.HeartbeatIntervalMs)
		}
	})
}

// TestBadInput sends invalid requests through the wire: each is
// InvalidArgument with reason INVALID_ARGUMENT and a message that starts
// with the field's name.
func TestBadInput(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		sid := openRaw(t, ctx, api, longTTL).SessionId
		long := strings.Repeat("k", store.MaxKeyLen+1)
		cases := []struct {
			name  string
			field string
			call  func() error
		}{
			{"ttl negative", "ttl_ms", func() error {
				_, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: -1})
				return err
			}},
			{"ttl below minimum", "ttl_ms", func() error {
				_, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: 1999})
				return err
			}},
			{"ttl above maximum", "ttl_ms", func() error {
				_, err := api.OpenSession(ctx, &lockdv1.OpenSessionRequest{TtlMs: 3600001})
				return err
			}},
			{"close empty session id", "session_id", func() error {
				_, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{})
				return err
			}},
			{"close session id with space", "session_id", func() error {
				_, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: "a b"})
				return err
			}},
			{"acquire empty session id", "session_id", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{Key: "k"})
				return err
			}},
			{"acquire empty key", "key", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid})
				return err
			}},
			{"acquire 513-byte key", "key", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: long})
				return err
			}},
			{"acquire key with NUL", "key", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: "a\x00b"})
				return err
			}},
			{"acquire negative wait", "wait_timeout_ms", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: "k", Wait: true, WaitTimeoutMs: -1})
				return err
			}},
			{"acquire wait above maximum", "wait_timeout_ms", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: "k", Wait: true,
					WaitTimeoutMs: server.MaxWait.Milliseconds() + 1})
				return err
			}},
			{"try with wait timeout", "wait_timeout_ms", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: "k", WaitTimeoutMs: 5})
				return err
			}},
			{"acquire negative lock delay", "lock_delay_ms", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: "k", LockDelayMs: -1})
				return err
			}},
			{"acquire lock delay above server maximum", "lock_delay_ms", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: "k", LockDelayMs: time.Hour.Milliseconds() + 1})
				return err
			}},
			{"acquire max hold below minimum", "max_hold_ms", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: "k", MaxHoldMs: 999})
				return err
			}},
			{"acquire semaphore with lock delay", "lock_delay_ms", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: "k", Limit: 2, LockDelayMs: 1000})
				return err
			}},
			{"acquire shared with max hold", "max_hold_ms", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: "k",
					Mode: lockdv1.LockMode_LOCK_MODE_SHARED, MaxHoldMs: 1000})
				return err
			}},
			{"acquire exclusive with lock delay", "lock_delay_ms", func() error {
				_, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: "k",
					Mode: lockdv1.LockMode_LOCK_MODE_EXCLUSIVE, LockDelayMs: 1000})
				return err
			}},
			{"release zero token", "token", func() error {
				_, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: sid, Key: "k"})
				return err
			}},
			{"release empty key", "key", func() error {
				_, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: sid, Token: 1})
				return err
			}},
			{"inspect empty key", "key", func() error {
				_, err := api.Inspect(ctx, &lockdv1.InspectRequest{})
				return err
			}},
			{"list prefix with NUL", "prefix", func() error {
				_, err := api.List(ctx, &lockdv1.ListRequest{Prefix: "\x00"})
				return err
			}},
			{"list limit above maximum", "limit", func() error {
				_, err := api.List(ctx, &lockdv1.ListRequest{Limit: store.MaxListLimit + 1})
				return err
			}},
			{"list negative limit", "limit", func() error {
				_, err := api.List(ctx, &lockdv1.ListRequest{Limit: -1})
				return err
			}},
			{"list bad page token", "page_token", func() error {
				_, err := api.List(ctx, &lockdv1.ListRequest{PageToken: "not base64!"})
				return err
			}},
			{"revoke empty key", "key", func() error {
				_, err := api.Revoke(ctx, &lockdv1.RevokeRequest{})
				return err
			}},
			{"watch prefix too long", "prefix", func() error {
				w, err := api.Watch(ctx, &lockdv1.WatchRequest{Prefix: long})
				if err != nil {
					return err
				}
				_, err = w.Recv()
				return err
			}},
		}
		for _, tc := range cases {
			err := tc.call()
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || reason(err) != wireerr.ReasonInvalidArgument ||
				!strings.HasPrefix(st.Message(), tc.field+": ") {
				t.Errorf("%s: got %v (reason %q); want InvalidArgument, reason %s, message starting %q",
					tc.name, err, reason(err), wireerr.ReasonInvalidArgument, tc.field+": ")
			}
			// The field and what is wrong with it travel as data too.
			if v, ok := wireerr.FieldViolation(st); !ok || v.Field != tc.field || v.Description == "" ||
				v.Message() != st.Message() || strings.Contains(st.Message(), "store:") {
				t.Errorf("%s: field violation %+v (present %v) with message %q; want field %q, a description, and the message %q",
					tc.name, v, ok, st.Message(), tc.field, "<field>: <description>")
			}
		}
		// Nothing was granted by the bad acquires.
		if info, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "k"}); err != nil || info.Held {
			t.Errorf("Inspect(k) after bad acquires = %v, %v; want not held", info, err)
		}
		// A request above the size limit is invalid input naming the
		// request (C2 #ct2-bad-input), not a limit to retry.
		_, err := api.List(ctx, &lockdv1.ListRequest{Prefix: strings.Repeat("p", server.MaxRecvMsgSize)})
		if status.Code(err) != codes.InvalidArgument || reason(err) != wireerr.ReasonInvalidArgument {
			t.Errorf("List with a %d-byte prefix: %v; want InvalidArgument, reason %s", server.MaxRecvMsgSize, err, wireerr.ReasonInvalidArgument)
		}
	})
}

// TestStoreErrorsOnTheWire checks server/errors.go: each store sentinel
// crosses the wire with its code and reason; an unclassified error is a
// generic Internal that does not leak its text.
func TestStoreErrorsOnTheWire(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var faulty *lockdtest.Faulty
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true,
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		cases := []struct {
			err    error
			code   codes.Code
			reason string
		}{
			{store.ErrContention, codes.Unavailable, wireerr.ReasonContention},
			{store.ErrUnavailable, codes.Unavailable, wireerr.ReasonUnavailable},
			{store.ErrNotLeader, codes.Unavailable, wireerr.ReasonNotLeader},
			{store.ErrSessionDead, codes.FailedPrecondition, wireerr.ReasonSessionDead},
			{store.ErrNotOwner, codes.PermissionDenied, wireerr.ReasonNotOwner},
			{store.ErrInvalidArgument, codes.InvalidArgument, wireerr.ReasonInvalidArgument},
			{errors.New("secret driver detail"), codes.Internal, wireerr.ReasonInternal},
		}
		for _, tc := range cases {
			faulty.Fail("inspect", tc.err)
			_, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "k"})
			if status.Code(err) != tc.code || reason(err) != tc.reason {
				t.Errorf("store error %v: got %v (reason %q); want %v, %s", tc.err, err, reason(err), tc.code, tc.reason)
			}
			if strings.Contains(status.Convert(err).Message(), "secret") {
				t.Errorf("store error %v: message %q leaks the internal error", tc.err, status.Convert(err).Message())
			}
		}
		faulty.Fail("inspect", nil)
		if _, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "k"}); err != nil {
			t.Errorf("Inspect after clearing the fault: %v", err)
		}
	})
}

func TestAcquireReleaseRaw(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		a := openRaw(t, ctx, api, longTTL).SessionId
		b := openRaw(t, ctx, api, longTTL).SessionId

		ga, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: a, Key: "k"})
		if err != nil || !ga.Granted || ga.Token == 0 || ga.RemainingMs <= 0 {
			t.Fatalf("Acquire(a, k) = %v, %v; want granted with a token and remaining", ga, err)
		}
		again, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: a, Key: "k", Wait: true})
		if err != nil || !again.Granted || again.Token != ga.Token {
			t.Errorf("Acquire(a, k) again = %v, %v; want the same grant (token %d)", again, err, ga.Token)
		}
		miss, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: b, Key: "k"})
		if err != nil || miss.Granted {
			t.Errorf("try Acquire(b, k) while a holds it = %v, %v; want granted=false, no error", miss, err)
		}
		// A wait that times out.
		start := time.Now()
		_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: b, Key: "k", Wait: true, WaitTimeoutMs: 300})
		if status.Code(err) != codes.DeadlineExceeded || reason(err) != wireerr.ReasonWaitTimeout {
			t.Errorf("Acquire(b, k, wait 300ms) = %v (reason %q); want DeadlineExceeded, WAIT_TIMEOUT", err, reason(err))
		}
		if took := time.Since(start); took < 300*time.Millisecond {
			t.Errorf("wait timeout after %v; want >= 300ms", took)
		}
		info, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "k"})
		if err != nil || !info.Held || info.Lock.SessionId != a || info.Lock.Token != ga.Token || len(info.Lock.Waiters) != 0 {
			t.Errorf("Inspect(k) = %v, %v; want held by a with token %d, no waiters", info, err, ga.Token)
		}
		// Release by the wrong session, then with a stale token: not owner.
		if _, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: b, Key: "k", Token: ga.Token}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("Release by b = %v; want PermissionDenied", err)
		}
		if _, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: a, Key: "k", Token: ga.Token + 1000}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("Release with a wrong token = %v; want PermissionDenied", err)
		}
		if _, err := api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: a, Key: "k", Token: ga.Token}); err != nil {
			t.Fatalf("Release by a: %v", err)
		}
		gb, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: b, Key: "k"})
		if err != nil || !gb.Granted || gb.Token <= ga.Token {
			t.Errorf("Acquire(b, k) after release = %v, %v; want granted with token > %d", gb, err, ga.Token)
		}
		// Closing a session releases its locks; closing twice is fine.
		closed, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: b})
		if err != nil || closed.Released != 1 {
			t.Errorf("CloseSession(b) = %v, %v; want released 1", closed, err)
		}
		if closed, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: b}); err != nil || closed.Released != 0 {
			t.Errorf("CloseSession(b) again = %v, %v; want released 0", closed, err)
		}
		if _, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: b, Key: "k"}); status.Code(err) != codes.FailedPrecondition ||
			reason(err) != wireerr.ReasonSessionDead {
			t.Errorf("Acquire on a closed session = %v; want FailedPrecondition SESSION_DEAD", err)
		}
		if info, err := api.Inspect(ctx, &lockdv1.InspectRequest{Key: "k"}); err != nil || info.Held {
			t.Errorf("Inspect(k) after close = %v, %v; want free", info, err)
		}
	})
}

func TestListPaging(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		sid := openRaw(t, ctx, api, longTTL).SessionId
		want := []string{"p/a", "p/b", "p/c", "p/d", "p/e"}
		for _, k := range append([]string{"q/x"}, want...) {
			if r, err := api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, Key: k}); err != nil || !r.Granted {
				t.Fatalf("Acquire(%s) = %v, %v", k, r, err)
			}
		}
		var got []string
		token := ""
		for pages := 0; ; pages++ {
			if pages > 5 {
				t.Fatalf("List did not end after %d pages", pages)
			}
			resp, err := api.List(ctx, &lockdv1.ListRequest{Prefix: "p/", PageToken: token, Limit: 2})
			if err != nil {
				t.Fatalf("List(p/, %q): %v", token, err)
			}
			for _, l := range resp.Locks {
				got = append(got, l.Key)
				if l.SessionId != sid || l.Token == 0 || l.AcquiredAt == nil {
					t.Errorf("List entry %v: want session %s, a token and acquired_at", l, sid)
				}
			}
			if token = resp.NextPageToken; token == "" {
				break
			}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("List(p/) pages = %v; want %v", got, want)
		}
	})
}

// TestKeepAliveStream drives one KeepAlive stream with several sessions.
func TestKeepAliveStream(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var faulty *lockdtest.Faulty
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true,
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		ctx := testCtx(t, 60*time.Second)
		api := dial(t, srv.Addr)
		var ids []string
		for range 5 {
			ids = append(ids, openRaw(t, ctx, api, longTTL).SessionId)
		}
		stream, err := api.KeepAlive(ctx)
		if err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		send := func(id string, rid uint64) {
			t.Helper()
			if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: id, RequestId: rid}); err != nil {
				t.Fatalf("KeepAlive send: %v", err)
			}
		}
		recv := func() *lockdv1.KeepAliveResponse {
			t.Helper()
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("KeepAlive recv: %v", err)
			}
			return r
		}
		for i, id := range ids {
			send(id, uint64(i+1))
		}
		seen := map[uint64]bool{}
		for range ids {
			r := recv()
			if !r.Live || r.Error != nil || r.RemainingMs <= 0 || r.SessionId != ids[r.RequestId-1] {
				t.Errorf("heartbeat reply %v; want live with remaining for session %d", r, r.RequestId)
			}
			seen[r.RequestId] = true
		}
		if len(seen) != len(ids) {
			t.Errorf("replies for requests %v; want one per request", seen)
		}
		// Unknown session: not live. Malformed id: not live.
		send("NOSUCHSESSION0000000000000", 100)
		if r := recv(); r.RequestId != 100 || r.Live || r.Error != nil {
			t.Errorf("heartbeat of an unknown session = %v; want live=false without error", r)
		}
		send("bad id", 101)
		if r := recv(); r.RequestId != 101 || r.Live {
			t.Errorf("heartbeat of a malformed id = %v; want live=false", r)
		}
		// A transient backend error: a retryable per-session error, the
		// session stays live.
		faulty.Fail("heartbeat", store.ErrUnavailable)
		send(ids[0], 102)
		r := recv()
		if r.RequestId != 102 || r.Error == nil || codes.Code(r.Error.Code) != codes.Unavailable ||
			r.Error.Reason != wireerr.ReasonUnavailable || r.RemainingMs != 0 {
			t.Errorf("heartbeat during an outage = %v; want error UNAVAILABLE and no remaining", r)
		}
		faulty.Fail("heartbeat", nil)
		send(ids[0], 103)
		if r := recv(); r.RequestId != 103 || !r.Live || r.Error != nil {
			t.Errorf("heartbeat after the outage = %v; want live", r)
		}
		// A closed session is reported dead on the stream.
		if _, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: ids[1]}); err != nil {
			t.Fatalf("CloseSession: %v", err)
		}
		send(ids[1], 104)
		if r := recv(); r.RequestId != 104 || r.Live || r.Error != nil {
			t.Errorf("heartbeat of a closed session = %v; want live=false", r)
		}
		// request_id 0 is refused.
		send(ids[0], 0)
		if r := recv(); r.Error == nil || codes.Code(r.Error.Code) != codes.InvalidArgument {
			t.Errorf("heartbeat with request_id 0 = %v; want error INVALID_ARGUMENT", r)
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatalf("CloseSend: %v", err)
		}
	})
}

func TestHealthReflectionMetrics(t *testing.T) {
	srv := lockdtest.StartBackend(t, lockdtest.Backends[len(lockdtest.Backends)-1], lockdtest.Options{NoClient: true})
	ctx := testCtx(t, 30*time.Second)
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, svc := range []string{"", "lockd.v1.LockService"} {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health Check(%q) = %v, %v; want SERVING", svc, resp, err)
		}
	}
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatalf("reflection send: %v", err)
	}
	resp, err := rs.Recv()
	if err != nil {
		t.Fatalf("reflection recv: %v", err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "lockd.v1.LockService") {
		t.Errorf("reflection lists %v; want lockd.v1.LockService", names)
	}
	_ = rs.CloseSend()
}
