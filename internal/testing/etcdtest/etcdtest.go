package etcdtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/testkit"
)

// Ticks of the shared server: etcd's minimum lease TTL is then one second.
const (
	TickMs     = 10
	ElectionMs = 100
)

var shared struct {
	mu     sync.Mutex
	server *embedetcd.Server
	dir    string
	err    error
}

// Main runs the tests, stops the shared server if one was started, and then
// fails the run if goroutines leaked (goleak; opts are passed on). It does
// not return.
func Main(m *testing.M, opts ...goleak.Option) {
	testkit.Main(m, []func(){Stop}, opts...)
}

// Stop stops the shared server, if one was started, and removes its data.
// Main calls it; a TestMain that cannot use Main (because it also sets up
// something else) calls it after m.Run.
func Stop() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.server != nil {
		shared.server.Close()
		shared.server = nil
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
		shared.dir = ""
	}
}

// Endpoints returns the client URLs of the shared server, starting it on
// first use.
func Endpoints(t testing.TB) []string {
	t.Helper()
	eps, err := SharedEndpoints()
	if err != nil {
		t.Fatalf("etcdtest: start embedded etcd: %v", err)
	}
	return eps
}

// SharedEndpoints is Endpoints for code that has no *testing.T (runnable
// examples): it returns the error instead of failing a test.
func SharedEndpoints() ([]string, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.server == nil && shared.err == nil {
		shared.err = startShared()
	}
	if shared.err != nil {
		return nil, shared.err
	}
	return shared.server.Endpoints(), nil
}

func startShared() error {
	dir, err := os.MkdirTemp("", "etcdtest-")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: dir, TickMs: TickMs, ElectionMs: ElectionMs})
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	shared.server, shared.dir = s, dir
	return nil
}

// ClientConfig is the clientv3 configuration the tests use: quiet logger,
// quick reconnects after an outage (gRPC's default backoff grows to two
// minutes).
func ClientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	}
}

// NewClient returns a client for endpoints (the shared server when none are
// given), closed when the test ends.
func NewClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	if len(endpoints) == 0 {
		endpoints = Endpoints(t)
	}
	cli, err := clientv3.New(ClientConfig(endpoints))
	if err != nil {
		t.Fatalf("etcdtest: clientv3.New(%v): %v", endpoints, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

var prefixSeq atomic.Uint64

// Prefix returns a key prefix no other test of this binary uses, such as
// "/t/12-TestFoo_bar/". No returned prefix is a prefix of another.
func Prefix(t testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return fmt.Sprintf("/t/%d-%s/", prefixSeq.Add(1), name)
}
