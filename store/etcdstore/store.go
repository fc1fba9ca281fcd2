package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
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
}

// Store is a store.LockStore on etcd. It is safe for concurrent use.
//
// Restart semantics: a Store's sessions live in this process. When lockd
// restarts, the new process does not know them; their leases lose their
// keepalives and etcd removes every attached key (grants and waiters) once
// the TTL has passed. This diverges from PostgreSQL, where session rows
// survive a lockd restart and a client may carry on with its session; on
// etcd the client opens a new one (docs/backends.md). Close likewise leaves
// sessions to expire.
type Store struct {
	cli    *clientv3.Client
	lc     pb.LeaseClient
	prefix string
	log    telemetry.Log
	met    *telemetry.Metrics

	ctx       context.Context // cancelled by Close; parent of every background goroutine
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup

	epoch  time.Time     // New's time: origin of the keepalive send grid
	wake   chan struct{} // pokes the keepalive owner; capacity 1
	events chan kaEvent  // keepalive streams → keepalive owner

	batch *batcher // group commit of grants and releases (batch.go)

	mu       sync.Mutex
	sessions map[store.SessionID]*session // live and recently dead sessions
	// waiting holds, per lockd key, the Acquire calls of this Store waiting
	// in its queue: a release guesses the first in line from it (see
	// DeleteIfOwner).
	waiting map[string][]*localWaiter
	byLease map[clientv3.LeaseID]*session
	due     dueHeap // sessions by when the keepalive owner next looks at them
	closed  bool
}

var _ store.LockStore = (*Store)(nil)

// New returns a Store using cli, which the caller keeps owning (Close does
// not close it). It checks that etcd answers before returning.
func New(ctx context.Context, cli *clientv3.Client, opts Options) (*Store, error) {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") || strings.IndexByte(prefix, 0) >= 0 {
		return nil, fmt.Errorf("%w: etcdstore: prefix %q must end with / and contain no NUL", store.ErrInvalidArgument, prefix)
	}
	if _, err := cli.Get(ctx, prefix, clientv3.WithCountOnly(), clientv3.WithLimit(1)); err != nil {
		return nil, fmt.Errorf("etcdstore: reach etcd: %w", classify(ctx, err))
	}
	s := &Store{
		cli:      cli,
		lc:       pb.NewLeaseClient(cli.ActiveConnection()),
		prefix:   prefix,
		log:      telemetry.Log{L: opts.Logger, Backend: Backend},
		met:      opts.Metrics,
		epoch:    time.Now(),
		wake:     make(chan struct{}, 1),
		events:   make(chan kaEvent, 64),
		sessions: make(map[store.SessionID]*session),
		waiting:  make(map[string][]*localWaiter),
		byLease:  make(map[clientv3.LeaseID]*session),
		batch:    newBatcher(),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1 + maxInflight)
	go s.keepaliveLoop() // exits when Close cancels s.ctx
	for range maxInflight {
		go s.committer() // exits when Close cancels s.ctx and nothing it took is unanswered
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
	})
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

// Key layout (see the package doc).

func (s *Store) lockKey(key string) string   { return s.prefix + "l/" + key }
func (s *Store) markerKey(key string) string { return s.prefix + "l/" + key + "\x00" }
func (s *Store) queuePrefix(key string) string {
	return s.prefix + "q/" + key + "\x00"
}
func (s *Store) waiterKey(key string, id store.SessionID) string {
	return s.queuePrefix(key) + string(id)
}

// userKey turns an etcd lock key back into the lockd key; ok is false for
// markers and keys outside the lock space.
func (s *Store) userKey(etcdKey []byte) (string, bool) {
	k, ok := strings.CutPrefix(string(etcdKey), s.prefix+"l/")
	if !ok || strings.IndexByte(k, 0) >= 0 {
		return "", false
	}
	return k, true
}

// grantValue is the value of a grant key.
func grantValue(id store.SessionID, at time.Time) string {
	return string(id) + " " + strconv.FormatInt(at.UnixNano(), 10)
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
)

// errMalformed reports a key this package did not write the way it reads
// it: someone else writes under the prefix.
var errMalformed = errors.New("etcdstore: malformed data under the prefix")
