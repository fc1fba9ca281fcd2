package client

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// Defaults of the SDK.
const (
	// DefaultBackoffMin and DefaultBackoffMax bound the backoff between
	// retries of a retryable error and between KeepAlive stream reconnects.
	DefaultBackoffMin = 50 * time.Millisecond
	DefaultBackoffMax = 2 * time.Second
	// DefaultCloseTimeout bounds the best-effort CloseSession calls of
	// Client.Close and of a session whose deadline passed.
	DefaultCloseTimeout = 2 * time.Second
	// MinHeartbeatInterval is the shortest heartbeat interval
	// WithHeartbeatInterval accepts (as lock.client.heartbeat-interval).
	MinHeartbeatInterval = 100 * time.Millisecond
)

type options struct {
	transport         transportOptions // tls.go
	token             tokenOptions     // token.go
	dial              []grpc.DialOption
	addresses         []string // WithAddresses (failover.go)
	logger            *slog.Logger
	clock             Clock
	safetyMargin      time.Duration
	heartbeatInterval time.Duration
	ttl               time.Duration
	backoffMin        time.Duration
	backoffMax        time.Duration
	tracer            trace.TracerProvider // WithTracerProvider (trace.go); nil: no tracing
}

// Option configures a Client.
type Option func(*options)

// WithDialOptions adds gRPC dial options, after the SDK's own. Choose the
// transport with WithTLS, WithTLSFiles, WithTransportCredentials or
// WithInsecure (tls.go), not with credentials given here.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// WithLogger sets the SDK's logger; by default logs are discarded.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// orDiscard returns l, or a logger that drops everything when l is nil.
func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// WithClock replaces the real monotonic clock (for tests).
func WithClock(c Clock) Option { return func(o *options) { o.clock = c } }

// WithSafetyMargin overrides the safety margin the server advertises
// (lock.client.safety-margin): how long before the backend could free a
// session's locks the client stops trusting them. As on the server, it must
// be > 0 and < TTL/2: New checks it against WithTTL, NewSession against the
// session's TTL; either returns ErrInvalidArgument otherwise.
func WithSafetyMargin(d time.Duration) Option { return func(o *options) { o.safetyMargin = d } }

// WithHeartbeatInterval overrides the heartbeat interval the server
// advertises (lock.client.heartbeat-interval, default TTL/3). A session's
// heartbeat is sent at most an interval after its previous one, at an
// instant of the Client's grid for that interval (one random phase per
// Client), so that the Client's sessions of one interval send theirs
// together (C2 #ct2-deadline). As on the
// server, it must lie in [MinHeartbeatInterval, TTL − 2×safety margin]: New
// checks what it can (WithTTL, WithSafetyMargin), NewSession the rest once
// the session's TTL and margin are known; either returns ErrInvalidArgument
// otherwise.
func WithHeartbeatInterval(d time.Duration) Option {
	return func(o *options) { o.heartbeatInterval = d }
}

// checkTiming checks a safety margin and a heartbeat interval against a
// session TTL with the server's rules (C5 lock.client.*): 0 < margin <
// ttl/2, and MinHeartbeatInterval <= interval <= ttl − 2×margin. A zero
// ttl, margin or interval is not known yet and not checked, except that an
// interval must be below a known ttl whatever the margin.
func checkTiming(ttl, margin, interval time.Duration) error {
	switch {
	case margin < 0 || interval < 0 || ttl < 0:
		return fmt.Errorf("%w: negative safety margin (%v), heartbeat interval (%v) or ttl (%v)",
			ErrInvalidArgument, margin, interval, ttl)
	case ttl > 0 && margin > 0 && margin >= ttl/2:
		return fmt.Errorf("%w: safety margin %v must be > 0 and < ttl/2 (ttl %v)", ErrInvalidArgument, margin, ttl)
	case interval > 0 && interval < MinHeartbeatInterval:
		return fmt.Errorf("%w: heartbeat interval %v is below the minimum %v", ErrInvalidArgument, interval,
			MinHeartbeatInterval)
	case ttl > 0 && margin > 0 && interval > ttl-2*margin:
		return fmt.Errorf("%w: heartbeat interval %v must be at most ttl − 2×safety margin = %v (ttl %v, margin %v)",
			ErrInvalidArgument, interval, ttl-2*margin, ttl, margin)
	case ttl > 0 && interval >= ttl:
		return fmt.Errorf("%w: heartbeat interval %v must be below the ttl %v", ErrInvalidArgument, interval, ttl)
	}
	return nil
}

// WithTTL sets the TTL of the client's sessions; 0 (the default) uses the
// server's lock.session.ttl. WithSessionTTL overrides it per session.
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithBackoff sets the bounds of the retry and reconnect backoff.
func WithBackoff(minWait, maxWait time.Duration) Option {
	return func(o *options) { o.backoffMin, o.backoffMax = minWait, maxWait }
}

// SessionOption configures one session.
type SessionOption func(*sessionOptions)

type sessionOptions struct {
	ttl       time.Duration
	owner     string
	labels    map[string]string
	lockDelay time.Duration
}

// WithOwner says who holds the session's locks: an owner string (at most
// 128 bytes of printable UTF-8, e.g. "web-3 (pid 812)") and a few labels (at
// most 8; keys 1..64 bytes, values at most 64 bytes). Inspect, List and the
// ErrLocked of other sessions' TryAcquire show them.
func WithOwner(owner string, labels map[string]string) SessionOption {
	return func(o *sessionOptions) { o.owner, o.labels = owner, maps.Clone(labels) }
}

// WithSessionTTL sets the session's TTL (2s..1h, more than twice the safety
// margin); 0 uses the client's WithTTL or the server's default.
func WithSessionTTL(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.ttl = d }
}

// WithSessionLockDelay gives every plain lock of the session a lock-delay of
// d unless its Acquire says otherwise (WithLockDelay): see WithLockDelay.
// Semaphore slots and read/write sides (WithLimit, Shared, Exclusive) have
// no lock-delay and do not get it.
func WithSessionLockDelay(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.lockDelay = d }
}

// AcquireOption configures one Acquire.
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	waitTimeout  time.Duration
	value        []byte
	limit        uint32
	mode         lockdv1.LockMode
	lockDelay    time.Duration
	lockDelaySet bool
	maxHold      time.Duration
	noDeadlock   bool
	updates      func(WaitUpdate) // WithWaitUpdates (waitupdates.go)
	updateEvery  time.Duration
}

// WithoutDeadlockCheck opts Acquire out of deadlock refusal (C2
// #ct2-deadlock), for a caller that queues on purpose: its wait still
// counts when the server looks for cycles of waiting sessions, but it is
// never the one refused with ErrDeadlock; another wait of the cycle is, if
// any did not opt out. Older servers ignore it.
func WithoutDeadlockCheck() AcquireOption {
	return func(o *acquireOptions) { o.noDeadlock = true }
}

// WithLimit makes the lock a counting semaphore of n: up to n sessions hold
// the key at once, each with a Lock of its own and its own fencing token,
// and the others wait in FIFO order. Every caller of one key must use the
// same n while the key has holders or waiters; another n (or a plain
// Acquire) fails with ErrLimitMismatch. 0 and 1 are the plain lock; at most
// 1024.
func WithLimit(n uint32) AcquireOption {
	return func(o *acquireOptions) { o.limit = n }
}

// Shared takes the reader side of a read/write lock: held together with
// other Shared holders, never with an Exclusive one. A waiting Exclusive
// request blocks later Shared ones, so writers do not starve. Every grant
// has its own fencing token, and a writer's token is above the token of
// every reader granted before it: a resource that remembers the highest
// writer token it has seen can reject a reader with a lower token, whose
// grant ended before the writer's began.
func Shared() AcquireOption {
	return func(o *acquireOptions) { o.mode = lockdv1.LockMode_LOCK_MODE_SHARED }
}

// Exclusive takes the writer side of a read/write lock (see Shared). A
// plain Acquire without it is a lock of another kind: readers and writers
// of one key both pass Shared or Exclusive.
func Exclusive() AcquireOption {
	return func(o *acquireOptions) { o.mode = lockdv1.LockMode_LOCK_MODE_EXCLUSIVE }
}

// WithLockDelay sets the lock's lock-delay (whole milliseconds, at most the
// server's lock.server.max-lock-delay; 0: none), overriding the session's
// WithSessionLockDelay: if the lock ends involuntarily — the session
// expires or its client falls silent, an administrator revokes it, its
// maximum hold runs out — nobody is granted the key until d has passed, so
// a holder that lost the lock without knowing it has d to notice before
// anyone else acts (for resources that cannot check fencing tokens). A
// Release or Session.Close hands the key over at once. Plain locks only:
// with WithLimit, Shared or Exclusive a lock-delay above 0 is
// ErrInvalidArgument. See docs/contracts/C2.md #ct2-delay.
func WithLockDelay(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.lockDelay, o.lockDelaySet = d, true }
}

// WithMaxHold makes the server revoke the lock once it has been held for d
// (1s..168h, at most the server's lock.server.max-hold-limit), so a wedged
// holder cannot keep the key for ever: Lock.Done closes and Lock.Err
// matches ErrMaxHold (and ErrLockLost). Plain locks only: with WithLimit,
// Shared or Exclusive it is ErrInvalidArgument.
func WithMaxHold(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.maxHold = d }
}

// WithValue attaches v (at most 4096 bytes) to the grant: Inspect and List
// show it for as long as the grant lasts.
func WithValue(v []byte) AcquireOption {
	return func(o *acquireOptions) { o.value = slices.Clone(v) }
}

// WithWaitTimeout bounds how long Acquire waits in the queue; when it runs
// out Acquire returns ErrWaitTimeout. Without it Acquire waits until its
// context ends. At most the server's maximum wait (10 minutes).
func WithWaitTimeout(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.waitTimeout = d }
}

// ListOptions select a page of Client.List.
type ListOptions struct {
	// PageToken is the token a previous List returned; empty for the first
	// page.
	PageToken string
	// Limit is the page size: 0 means 100, at most 1000.
	Limit int
}
