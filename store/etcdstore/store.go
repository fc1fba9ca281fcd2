package etcdstore

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/internal/deadlock"
	"lock.dev/lockd/store/internal/groupcommit"
)

// Backend is the backend label of this package's logs and metrics.
const Backend = "etcd"

// DefaultPrefix is the key prefix used when Options.Prefix is empty
// (C5 lock.etcd.prefix).
const DefaultPrefix = "/lockd/"

// Options configure a Store.
type Options struct {
	// Prefix starts every key the Store writes; it must end with "/".
	// Empty means DefaultPrefix. Stores sharing a prefix share locks.
	Prefix string
	// Logger receives the C4 log events; nil discards them.
	Logger *slog.Logger
	// Metrics records the C4 metrics; nil records nothing.
	Metrics *telemetry.Metrics
	// Exclusive promises that no other Store uses the prefix while this one
	// is open (lockd's embedded etcd, which only its own process serves).
	// The epoch is then raised at open so that every token issued from now
	// on is above this process's wall clock in µs: that covers a data dir
	// restored from an older copy, whose epoch and revisions are both old
	// (C2 #ct2-fencing). With several Stores on a prefix the epoch must stay
	// fixed (they compute the same token from the same revision), so a
	// shared etcd needs the operator steps of C2 after a restore.
	Exclusive bool
	// MarkerTTL is the TTL of the leases release markers are attached to;
	// 0 means DefaultMarkerTTL. Tests shorten it. Negative attaches markers
	// to no lease, so every distinct key released or revoked leaves its
	// marker in etcd forever: the behaviour before issue 11, kept only as
	// the control of the storage soak (test/soak).
	MarkerTTL time.Duration

	// deadlockInterval overrides deadlock.Interval (tests); negative: the
	// detector never scans on its own (tests scan by hand).
	deadlockInterval time.Duration
}

// Store is a store.LockStore on etcd. It is safe for concurrent use.
//
// Sessions are shared: each has a record in etcd that any Store on the
// prefix adopts (record.go, C2 #ct2-replicas). When lockd restarts, the new
// process adopts a session whose client comes back before its lease ran out
// (not on an Exclusive Store: a raised epoch). Close leaves sessions to
// expire, or to another Store that keeps them.
//
// Each structure has one owner with its own lock: the session table (mu,
// below), the lease keeping (keep, keepalive.go), the group-commit queue
// (batch, a groupcommit.Queue; batch.go), this Store's waiting Acquire calls (waiters,
// wait.go) and the held-set index LocksOf answers from (held, held.go).
// Lock order: mu before keep's lock and before held's; the others nest
// nothing.
type Store struct {
	cli       *clientv3.Client
	kv        pb.KVClient // the group commit's Txns on cli's connection (request.go)
	prefix    string
	inst      string // this Store's name in its keeper records (record.go)
	exclusive bool   // Options.Exclusive: adopts no session of an earlier epoch
	shift     int64  // token − revision of every grant: the prefix's epoch (epoch.go)
	log       telemetry.Log
	met       *telemetry.Metrics

	ctx       context.Context // cancelled by Close; parent of every background goroutine
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup // goroutines of the Store itself (the keeper waits for its own)

	keep  *keeper                     // keeps the sessions' leases alive (keepalive.go)
	batch *groupcommit.Queue[*txnReq] // group commit of grants and releases (batch.go)
	// commitHook, set by tests, is called by a committer with each batch's
	// keys before sending it.
	commitHook atomic.Pointer[func(keys []string)]
	// hook, set by tests, runs at the write paths' hook points with the
	// point and the key (runHook).
	hook atomic.Pointer[func(at hookPoint, key string)]

	waiters   localQueues        // Acquire calls of this Store waiting in a queue (wait.go)
	deadlocks *deadlock.Detector // C2 #ct2-deadlock (deadlock.go)

	marks *markerLeases // the short leases of release markers (marker.go)
	comp  companions    // lock-delay companion leases (delay.go)
	held  *heldIndex    // what LocksOf answers from (held.go)

	// waitingFirst, set by tests, runs when a Heartbeat starts waiting for
	// the keepalive an adoption sent (session.go).
	waitingFirst func()
	// Set by tests before the calls they affect (issue 24): waitingHook
	// runs when an Acquire starts waiting first in line for the grant
	// key's next change (wait.go); eventGate, when not nil, holds every
	// watch event a waiting Acquire receives until it is closed (the
	// notification path held back).
	waitingHook func(key string)
	eventGate   chan struct{}

	mu       sync.Mutex
	sessions map[store.SessionID]*session // live and recently dead sessions
	// unsure are the sessions an ExpireSession forgot with its outcome
	// unknown, until a later ExpireSession settles it (expire.go).
	unsure map[store.SessionID]unsureExpiry
	closed bool
}

var _ store.LockStore = (*Store)(nil)

// SharesSessions reports that every Store on a prefix can use every session
// (store.LockStore): a Store adopts a session it does not know from its
// record in etcd (record.go, C2 #ct2-replicas).
func (s *Store) SharesSessions() bool { return true }

// New returns a Store using cli, which the caller keeps owning (Close does
// not close it). It reads the prefix's epoch (C2 #ct2-fencing), taking it
// if this is the first Store on the prefix, so etcd must answer.
func New(ctx context.Context, cli *clientv3.Client, opts Options) (*Store, error) {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") || strings.IndexByte(prefix, 0) >= 0 {
		return nil, fmt.Errorf("%w: etcdstore: prefix %q must end with / and contain no NUL", store.ErrInvalidArgument, prefix)
	}
	shift, err := loadEpoch(ctx, cli, prefix+epochName, time.Now(), opts.Exclusive)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: epoch: %w", classify(ctx, err))
	}
	s := &Store{
		cli:       cli,
		kv:        newKVClient(cli),
		prefix:    prefix,
		inst:      newInstanceID(),
		exclusive: opts.Exclusive,
		shift:     shift,
		log:       telemetry.Log{L: opts.Logger, Backend: Backend},
		met:       opts.Metrics,
		sessions:  make(map[store.SessionID]*session),
		unsure:    make(map[store.SessionID]unsureExpiry),
		batch:     groupcommit.New[*txnReq](maxBatch, errClosed),
		waiters:   localQueues{byKey: make(map[string][]*localWaiter)},
		marks:     newMarkerLeases(cli, opts.MarkerTTL),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.held = newHeldIndex(s)
	s.keep = newKeeper(s.ctx, cli, s.markDead, s.pruneDead, s.dropIdle)
	s.keep.start() // its owner exits when Close cancels s.ctx
	s.deadlocks = deadlock.New(s.waitGraph)
	if d := cmp.Or(opts.deadlockInterval, deadlock.Interval); d > 0 {
		s.wg.Add(1)
		go func() { // exits when Close cancels s.ctx
			defer s.wg.Done()
			s.deadlocks.Run(s.ctx, d)
		}()
	}
	s.wg.Add(maxInflight)
	for range maxInflight {
		go s.committer() // exits when Close closes the queue and nothing it took is unanswered
	}
	return s, nil
}

// Close stops the keepalive stream and every other goroutine of the Store
// and waits for them. Sessions are not closed: their leases expire after
// their TTL and etcd frees their keys. Every method of a closed Store returns
// an error wrapping store.ErrUnavailable. Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.cancel()
		s.batch.Close() // after cancel: batches being committed end at once
	})
	s.keep.wait()
	s.wg.Wait()
	return nil
}

// ClientConfig is the clientv3 configuration lockd uses for an etcd at
// endpoints: gRPC reconnects within a second after an outage (gRPC's own
// backoff grows to two minutes, far beyond a session TTL), and a dead TCP
// connection under an open stream is detected with gRPC pings (etcd's
// server refuses pings more often than every 5s, and pings without a
// stream). Its logger discards; set Logger to keep clientv3's logs.
func ClientConfig(endpoints []string, dialTimeout time.Duration) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          dialTimeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		Logger:               zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	}
}

// grantValue is the value of a grant key.
func grantValue(id store.SessionID, at time.Time) string {
	return string(grantValueBytes(id, at))
}

// grantValueBytes is grantValue in one allocation, as a request sends it.
func grantValueBytes(id store.SessionID, at time.Time) []byte {
	b := make([]byte, 0, len(id)+1+20)
	b = append(b, id...)
	b = append(b, ' ')
	return strconv.AppendInt(b, at.UnixNano(), 10)
}

// parseGrant decodes a grant key's value.
func parseGrant(v []byte) (store.SessionID, time.Time, error) {
	id, at, ok := strings.Cut(string(v), " ")
	ns, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil || id == "" {
		return "", time.Time{}, fmt.Errorf("etcdstore: malformed grant value %q", v)
	}
	return store.SessionID(id), time.Unix(0, ns), nil
}

// Release marker values: why the grant deleted in the same revision went.
const (
	markReleased = "released"
	markRevoked  = "revoked"
	// markValue starts the marker SetValue writes ("value <session>
	// <token>"), with no change to the grant key: Watch's value event.
	markValue   = "value "
	markMaxHold = "max_hold" // delay.go
)

// ready is the entry check of calls without a session: the caller's ctx
// still alive, the Store not closed.
func (s *Store) ready(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.isClosed() {
		return errClosed
	}
	return nil
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// hookPoint names a place on a write path where a test's hook (Store.hook)
// runs. One hook per Store, told which point it is at, so a test sees the
// points of one call in their order.
type hookPoint int

const (
	// hookReleaseTry: before each hand-over try of a plain lock's release
	// (DeleteIfOwner, grant.go).
	hookReleaseTry hookPoint = iota + 1
	// hookHandedOver: after a plain release's hand-over committed, before
	// the local waiter is told (grant.go).
	hookHandedOver
	// hookSlotReleaseTry: before each hand-over transaction of a slot's
	// release (releaseMulti, then handOverRest; handover.go).
	hookSlotReleaseTry
	// hookRevokeTry: before each transaction of a revoke (revokeGrant,
	// delay.go; revokeMulti, multi.go).
	hookRevokeTry
)

// runHook runs the test hook, if one is set, at point at for key.
func (s *Store) runHook(at hookPoint, key string) {
	if h := s.hook.Load(); h != nil {
		(*h)(at, key)
	}
}
