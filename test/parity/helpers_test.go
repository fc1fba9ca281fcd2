package parity

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// scenarioTimeout bounds one scenario on one backend.
const scenarioTimeout = 90 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), scenarioTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newClient returns an SDK client of addr, closed when the test ends.
func newClient(t *testing.T, addr string) *client.Client {
	t.Helper()
	// The test remembers the secrets of the SDK's sessions, so that raw
	// requests of a scenario can act for them (lockdtest.SessionSecrets).
	c, err := client.New(addr, client.WithBackoff(10*time.Millisecond, 200*time.Millisecond),
		client.WithDialOptions(lockdtest.SessionSecrets()...))
	if err != nil {
		t.Fatalf("client.New(%s): %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newSession(t *testing.T, ctx context.Context, c *client.Client, opts ...client.SessionOption) *client.Session {
	t.Helper()
	s, err := c.NewSession(ctx, opts...)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	return s
}

func acquire(t *testing.T, ctx context.Context, s *client.Session, key string, opts ...client.AcquireOption) *client.Lock {
	t.Helper()
	l, err := s.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return l
}

// rawAPI returns a plain lockd.v1 client of addr for scenarios that must
// misbehave (stop heartbeating, reuse a session across lockd processes,
// send invalid requests the SDK would refuse).
func rawAPI(t *testing.T, addr string) lockdv1.LockServiceClient {
	t.Helper()
	// Sessions' secrets are sent as the SDK sends them
	// (C2 #ct2-ownership), also through another lockd than the opener.
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		lockdtest.SessionSecrets()...)...)
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return lockdv1.NewLockServiceClient(conn)
}

// await receives one value from ch, failing the test after timeout.
func await[T any](t *testing.T, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("%s: nothing within %v", what, timeout)
	}
	var zero T
	return zero
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// grant is the result of an Acquire run in its own goroutine.
type grant struct {
	who string // which waiter, for scenarios with several
	l   *client.Lock
	err error
	at  time.Time // when the reply arrived
}

// acquireAsync runs s.Acquire(key) in a goroutine that sends its result on
// ch (which must have room) and exits; ctx bounds it.
func acquireAsync(ctx context.Context, s *client.Session, key, who string, ch chan<- grant) {
	go func() { // exits when Acquire returns (granted, failed or ctx ended)
		l, err := s.Acquire(ctx, key)
		ch <- grant{who: who, l: l, err: err, at: time.Now()}
	}()
}

// waitQueued polls Inspect until key has n waiters.
func waitQueued(t *testing.T, ctx context.Context, c *client.Client, key string, n int) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%d waiter(s) queued for %q", n, key), func() bool {
		info, err := c.Inspect(ctx, key)
		return err == nil && len(info.Waiters) == n
	})
}

// sdkSentinels are the SDK's sentinel errors, most specific first.
var sdkSentinels = []struct {
	name string
	err  error
}{
	{"ErrLimitMismatch", client.ErrLimitMismatch},
	{"ErrInvalidArgument", client.ErrInvalidArgument},
	{"ErrSessionExpired", client.ErrSessionExpired},
	{"ErrSessionDead", client.ErrSessionDead},
	{"ErrNotOwner", client.ErrNotOwner},
	{"ErrLocked", client.ErrLocked},
	{"ErrWaitTimeout", client.ErrWaitTimeout},
	{"ErrLockLost", client.ErrLockLost},
	{"ErrReleased", client.ErrReleased},
	{"ErrClosed", client.ErrClosed},
	{"ErrLimit", client.ErrLimit},
	{"ErrInternal", client.ErrInternal},
	{"ErrUnavailable", client.ErrUnavailable},
	{"context.Canceled", context.Canceled},
	{"context.DeadlineExceeded", context.DeadlineExceeded},
}

// sdkErr names the SDK sentinel err matches: "ok" for nil.
func sdkErr(err error) string {
	if err == nil {
		return "ok"
	}
	for _, s := range sdkSentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return fmt.Sprintf("unexpected(%v)", err)
}

// reasonCodes is the wire contract (proto/lockd/v1/wireerr): the gRPC code each
// ErrorInfo reason travels with.
var reasonCodes = map[string]codes.Code{
	wireerr.ReasonInvalidArgument: codes.InvalidArgument,
	wireerr.ReasonSessionDead:     codes.FailedPrecondition,
	wireerr.ReasonNotOwner:        codes.PermissionDenied,
	wireerr.ReasonContention:      codes.Unavailable,
	wireerr.ReasonNotLeader:       codes.Unavailable,
	wireerr.ReasonUnavailable:     codes.Unavailable,
	wireerr.ReasonWaitTimeout:     codes.DeadlineExceeded,
	wireerr.ReasonLimit:           codes.ResourceExhausted,
	wireerr.ReasonShuttingDown:    codes.Unavailable,
	wireerr.ReasonInternal:        codes.Internal,
}

// wireErr names the lockd ErrorInfo reason of a gRPC error ("OK" for nil),
// checking that it travels with the gRPC code the contract gives it and that
// the message is not empty. An error without a lockd reason is named by its
// code.
func wireErr(t *testing.T, err error) string {
	t.Helper()
	if err == nil {
		return "OK"
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Sprintf("non-status(%v)", err)
	}
	reason := ""
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == wireerr.Domain {
			reason = info.Reason
		}
	}
	if reason == "" {
		return "code:" + st.Code().String()
	}
	if want, ok := reasonCodes[reason]; !ok || st.Code() != want {
		t.Errorf("reason %s travelled with code %v; want %v", reason, st.Code(), want)
	}
	if st.Message() == "" {
		t.Errorf("reason %s with an empty message", reason)
	}
	return reason
}

// holder describes a key's state as Inspect reports it, naming sessions by
// the labels in names ("other" for an unknown one): free, held(A),
// held(A) waiters=[B C].
func holder(info client.LockInfo, err error, names map[string]string) string {
	if err != nil {
		return "error(" + sdkErr(err) + ")"
	}
	if !info.Held {
		return "free"
	}
	label := func(id string) string {
		if n, ok := names[id]; ok {
			return n
		}
		return "other"
	}
	out := "held(" + label(info.Session) + ")"
	if len(info.Waiters) > 0 {
		ws := make([]string, len(info.Waiters))
		for i, w := range info.Waiters {
			ws[i] = label(w)
		}
		out += " waiters=[" + strings.Join(ws, " ") + "]"
	}
	return out
}

// heartbeat sends one KeepAlive request for id on a stream of its own and
// returns the answer.
func heartbeat(t *testing.T, ctx context.Context, api lockdv1.LockServiceClient, id string) *lockdv1.KeepAliveResponse {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream, err := api.KeepAlive(sctx)
	if err != nil {
		t.Fatalf("KeepAlive: %v", err)
	}
	if err := stream.Send(&lockdv1.KeepAliveRequest{SessionId: id, RequestId: 1}); err != nil {
		t.Fatalf("KeepAlive Send: %v", err)
	}
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("KeepAlive Recv: %v", err)
		}
		if r.RequestId == 1 {
			_ = stream.CloseSend()
			return r
		}
	}
}

// liveness names a KeepAlive answer: live, dead or error(REASON).
func liveness(r *lockdv1.KeepAliveResponse) string {
	switch {
	case r.Error != nil:
		return "error(" + r.Error.Reason + ")"
	case r.Live:
		return "live"
	}
	return "dead"
}

// ms converts a remaining_ms field to a duration.
func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
