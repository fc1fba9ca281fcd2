package server_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// randomSecret is a wrong session secret of n bytes.
func randomSecret(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// wantDenied checks that err is PERMISSION_DENIED with reason want.
func wantDenied(t *testing.T, call string, err error, want string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied || reason(err) != want {
		t.Errorf("%s = %v (reason %q); want PERMISSION_DENIED %s", call, err, reason(err), want)
	}
}

// TestSessionOwnership is issue #12's "done when" for session ownership
// (C2 #ct2-ownership): a second client that reads the holder's session id
// from Inspect — and has the right token — can neither close the session,
// release its lock, acquire in it nor keep it alive; the lock stays held,
// the holder's Done does not fire, notices keep going to the holder, and
// the holder's session still ends when the holder goes silent (also while
// the stranger keeps sending heartbeats for it).
func TestSessionOwnership(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		logs := &lockdtest.Logs{}
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{Logger: logs.Logger()})
		ctx := testCtx(t, 2*time.Minute)

		// The holder talks to the server through a proxy, so it can be
		// made silent.
		proxy := testkit.NewProxy(t, srv.Addr)
		holder, err := client.New(proxy.Addr(), client.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
		if err != nil {
			t.Fatalf("client.New: %v", err)
		}
		t.Cleanup(func() { _ = holder.Close() })
		sess, err := holder.NewSession(ctx)
		if err != nil {
			t.Fatalf("NewSession: %v", err)
		}
		lockA, err := sess.Acquire(ctx, "sec/a")
		if err != nil {
			t.Fatalf("Acquire(sec/a): %v", err)
		}
		lockC, err := sess.Acquire(ctx, "sec/c")
		if err != nil {
			t.Fatalf("Acquire(sec/c): %v", err)
		}

		// The stranger reads what every reader may read.
		info, err := srv.Client.Inspect(ctx, "sec/a")
		if err != nil || !info.Held || info.Session != sess.ID() || info.Token != lockA.Token() {
			t.Fatalf("Inspect(sec/a) = %+v, %v; want held by %s with token %d", info, err, sess.ID(), lockA.Token())
		}
		sid, token := info.Session, info.Token
		api := dialBare(t, srv.Addr)
		secrets := map[string][]byte{wireerr.ReasonSessionSecretRequired: nil, wireerr.ReasonSessionSecretMismatch: randomSecret(32)}

		for want, secret := range secrets {
			_, err := api.CloseSession(ctx, &lockdv1.CloseSessionRequest{SessionId: sid, SessionSecret: secret})
			wantDenied(t, "CloseSession(holder's id)", err, want)
			_, err = api.Release(ctx, &lockdv1.ReleaseRequest{SessionId: sid, SessionSecret: secret, Key: "sec/a", Token: token})
			wantDenied(t, "Release(holder's id, key, token)", err, want)
			_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, SessionSecret: secret, Key: "sec/b"})
			wantDenied(t, "Acquire(holder's id, sec/b)", err, want)
			_, err = api.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: sid, SessionSecret: secret, Key: "sec/b", Wait: true, WaitTimeoutMs: 100})
			wantDenied(t, "Acquire(holder's id, sec/b, wait)", err, want)
		}
		if got, err := srv.Client.Inspect(ctx, "sec/b"); err != nil || got.Held {
			t.Errorf("Inspect(sec/b) after the refused acquires = %+v, %v; want free", got, err)
		}

		// KeepAlive: refused, per request, on the stranger's stream.
		kctx, kcancel := context.WithCancel(ctx)
		defer kcancel()
		stream, err := api.KeepAlive(kctx)
		if err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		carryOwnSession(t, ctx, api, stream) // keepalive_parked_test.go
		rid := uint64(0)
		// beat sends one refused heartbeat (acknowledging notice ids the
		// holder may have pending) and reads up to its answer; no message
		// on the stranger's stream may carry a notice of the session.
		beat := func(secret []byte, want string) {
			t.Helper()
			rid++
			if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: sid, SessionSecret: secret, RequestId: rid, Ack: []uint64{1, 2, 3}}); err != nil {
				t.Fatalf("KeepAlive send: %v", err)
			}
			for {
				r, err := stream.Recv()
				if err != nil {
					t.Fatalf("KeepAlive recv: %v", err)
				}
				if len(r.GetLost()) > 0 || r.GetHeld() != nil || r.GetRemainingMs() != 0 {
					t.Fatalf("the stranger's stream got %v; want no notice, held set or extension of the holder's session", r)
				}
				if r.GetRequestId() != rid {
					continue
				}
				if e := r.GetError(); e == nil || codes.Code(e.Code) != codes.PermissionDenied || e.Reason != want {
					t.Fatalf("KeepAlive(holder's id) answer = %v; want error PERMISSION_DENIED %s", r, want)
				}
				return
			}
		}
		for want, secret := range secrets {
			beat(secret, want)
		}

		// Notices still go to the holder: revoke sec/c; the holder learns
		// it, the stranger's stream carries nothing about it.
		if _, err := srv.Client.Revoke(ctx, "sec/c"); err != nil {
			t.Fatalf("Revoke(sec/c): %v", err)
		}
		select {
		case <-lockC.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("holder's lock on sec/c not lost within 10s of the revoke: its notice went elsewhere")
		}
		if !errors.Is(lockC.Err(), client.ErrLockLost) {
			t.Errorf("lock sec/c Err = %v; want ErrLockLost", lockC.Err())
		}
		beat(randomSecret(32), wireerr.ReasonSessionSecretMismatch)

		// The lock stands, the holder still trusts it.
		if got, err := srv.Client.Inspect(ctx, "sec/a"); err != nil || !got.Held || got.Session != sid || got.Token != token {
			t.Fatalf("Inspect(sec/a) after the attacks = %+v, %v; want still held by %s, token %d", got, err, sid, token)
		}
		select {
		case <-lockA.Done():
			t.Fatalf("holder's lock on sec/a lost: %v", lockA.Err())
		case <-sess.Done():
			t.Fatalf("holder's session ended: %v", sess.Err())
		default:
		}

		// Refusals are C4 events and metrics, naming the public id only.
		for _, m := range []string{"CloseSession", "Release", "Acquire", "KeepAlive"} {
			for _, r := range []string{"session_secret_required", "session_secret_mismatch"} {
				if n := deniedCount(t, srv, m, r); n < 1 {
					t.Errorf("lockd_auth_denied_total{method=%q,reason=%q} = %v; want ≥ 1", m, r, n)
				}
			}
		}
		events := logs.Find(telemetry.EventAuthDenied, nil)
		if len(events) < 11 {
			t.Errorf("auth_denied events: %d; want ≥ 11 (one per refusal)", len(events))
		}
		for _, e := range events {
			if e.Level != slog.LevelWarn || e.Attrs["session"] != sid || e.Attrs["method"] == "" || e.Attrs["reason"] == "" {
				t.Errorf("auth_denied event %+v; want warn with session %s, method, reason", e, sid)
			}
		}
		// No secret in any log line, in any usual encoding.
		for _, rec := range logs.All() {
			line := fmt.Sprint(rec.Message, rec.Attrs)
			for _, secret := range secrets {
				for _, enc := range []string{string(secret), fmt.Sprintf("%x", secret), base64.StdEncoding.EncodeToString(secret)} {
					if len(secret) > 0 && strings.Contains(line, enc) {
						t.Errorf("a session secret appears in the log line %q", line)
					}
				}
			}
		}

		// The holder falls silent while the stranger keeps heartbeating:
		// the session still ends, and its lock with it.
		proxy.Cut()
		stop := make(chan struct{})
		beating := make(chan struct{})
		go func() { // exits when stop closes or the stream fails
			defer close(beating)
			for i := uint64(1000); ; i++ {
				if stream.Send(&lockdv1.KeepAliveRequest{SessionId: sid, SessionSecret: randomSecret(32), RequestId: i}) != nil {
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
		go func() { // drains the stranger's answers; exits when the stream ends
			for {
				if _, err := stream.Recv(); err != nil {
					return
				}
			}
		}()
		testkit.Eventually(t, 4*lockdtest.TTL+10*time.Second, "the silent holder's lock is freed", func() bool {
			got, err := srv.Client.Inspect(ctx, "sec/a")
			return err == nil && !got.Held
		})
		close(stop)
		<-beating
		kcancel()
		select {
		case <-lockA.Done():
		case <-time.After(lockdtest.TTL):
			t.Error("the silent holder still trusts sec/a after its session was freed")
		}
	})
}

// deniedCount reads lockd_auth_denied_total{method, reason} from the
// server's registry.
func deniedCount(t *testing.T, srv *lockdtest.Server, method, reason string) float64 {
	t.Helper()
	mfs, err := srv.Registry.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lockd_auth_denied_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["method"] == method && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// bruteEnv, when set to a number, is how many random secrets
// TestSessionSecretBruteForce tries per backend (`make brute` sets 10⁶);
// unset, 1000.
const bruteEnv = "LOCKD_TEST_BRUTE_ATTEMPTS"

// TestSessionSecretBruteForce tries random secrets against a live session
// (held lock, owner heartbeating) on a KeepAlive stream: every one is
// refused with SESSION_SECRET_MISMATCH (or, past the refusal rate, LIMIT),
// and the owner's heartbeats from the same address go on; afterwards the session and its
// lock are untouched.
func TestSessionSecretBruteForce(t *testing.T) {
	attempts := 1000
	if v := os.Getenv(bruteEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive number", bruteEnv, v)
		}
		attempts = n
	}
	// Sequential (forBackendsAlone): a flood of a thousand attempts would
	// crowd the timing of the package's other tests.
	forBackendsAlone(t, func(t *testing.T, backend string) {
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
		ctx := testCtx(t, time.Hour)
		owner := dial(t, srv.Addr)
		// longTTL: the owner's expiry is not the subject. With the server's
		// 3 s TTL, its heartbeats, answered behind the flood, let it expire
		// once the package ran four tests at once (clean-clone run r41:
		// "owner's heartbeat answered not live … LOCK_LOST_REASON_EXPIRED").
		o := openRaw(t, ctx, owner, longTTL)
		g, err := owner.Acquire(ctx, &lockdv1.AcquireRequest{SessionId: o.SessionId, Key: "brute/k"})
		if err != nil || !g.Granted {
			t.Fatalf("Acquire(brute/k) = %v, %v; want a grant", g, err)
		}
		// The owner keeps its session alive meanwhile.
		octx, ocancel := context.WithCancel(ctx)
		ostream, err := owner.KeepAlive(octx)
		if err != nil {
			t.Fatalf("owner KeepAlive: %v", err)
		}
		ownerDone := make(chan error, 1)
		go func() { // exits when octx ends (or on a failure, reported)
			ownerDone <- func() error {
				for rid := uint64(1); ; rid++ {
					if err := ostream.Send(&lockdv1.KeepAliveRequest{SessionId: o.SessionId, RequestId: rid}); err != nil {
						return nil // octx ended
					}
					r, err := ostream.Recv()
					if err != nil {
						return nil
					}
					if !r.GetLive() && r.GetError() == nil {
						return fmt.Errorf("owner's heartbeat answered not live: %v", r)
					}
					select {
					case <-octx.Done():
						return nil
					case <-time.After(time.Duration(o.HeartbeatIntervalMs) * time.Millisecond):
					}
				}
			}()
		}()

		api := dialBare(t, srv.Addr)
		stream, err := api.KeepAlive(ctx)
		if err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		carryOwnSession(t, ctx, api, stream) // keepalive_parked_test.go
		// At most window requests in flight, far below what the server
		// buffers per stream, so it never ends the stream as a slow reader.
		const window = 128
		credit := make(chan struct{}, window)
		sendErr := make(chan error, 1)
		start := time.Now()
		go func() { // exits after the last send, or when the stream fails
			sendErr <- func() error {
				for i := 1; i <= attempts; i++ {
					credit <- struct{}{}
					n := 32
					if i%97 == 0 {
						n = 1 + i%64 // now and then a secret of another size
					}
					if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: o.SessionId, SessionSecret: randomSecret(n), RequestId: uint64(i)}); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
		// Past the refusal rate (C2 #ct2-limits) refusals are answered
		// RESOURCE_EXHAUSTED LIMIT instead: still refused, never live.
		refused, limited := 0, 0
		for refused+limited < attempts {
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("after %d refusals: KeepAlive recv: %v", refused+limited, err)
			}
			e := r.GetError()
			switch {
			case r.GetRequestId() == 0 || e == nil || r.GetRemainingMs() != 0 || r.GetHeld() != nil:
				t.Fatalf("attempt answer %v; want a refusal and nothing else", r)
			case codes.Code(e.Code) == codes.PermissionDenied && e.Reason == wireerr.ReasonSessionSecretMismatch:
				refused++
			case codes.Code(e.Code) == codes.ResourceExhausted && e.Reason == wireerr.ReasonLimit:
				limited++
			default:
				t.Fatalf("attempt answer %v; want PERMISSION_DENIED %s or RESOURCE_EXHAUSTED %s", r, wireerr.ReasonSessionSecretMismatch, wireerr.ReasonLimit)
			}
			<-credit
		}
		took := time.Since(start)
		if err := <-sendErr; err != nil {
			t.Fatalf("KeepAlive send: %v", err)
		}
		_ = stream.CloseSend()
		t.Logf("%s: %d random secrets refused in %v (%.0f/s; %d of them past the refusal rate)", backend, refused+limited, took,
			float64(refused+limited)/took.Seconds(), limited)

		if n := deniedCount(t, srv, "KeepAlive", "session_secret_mismatch"); n != float64(refused) {
			t.Errorf("lockd_auth_denied_total{KeepAlive, session_secret_mismatch} = %v; want %d", n, refused)
		}
		if n := counter(t, srv.Registry, "lockd_limit_rejections_total", map[string]string{"limit": "refusals"}); n != float64(limited) {
			t.Errorf("lockd_limit_rejections_total{refusals} = %v; want %d", n, limited)
		}
		info, err := owner.Inspect(ctx, &lockdv1.InspectRequest{Key: "brute/k"})
		if err != nil || !info.Held || info.Lock.SessionId != o.SessionId || info.Lock.Token != g.Token {
			t.Errorf("Inspect(brute/k) after the attempts = %v, %v; want held by the owner, token %d", info, err, g.Token)
		}
		ocancel()
		if err := <-ownerDone; err != nil {
			t.Error(err)
		}
	})
}
