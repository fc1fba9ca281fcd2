package lockdtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/etcdtest"
)

// sharedEtcd is the embedded etcd of this test binary, started on first
// use and stopped by Main. (etcdtest keeps its own shared server, stopped by
// etcdtest.Main, which cannot be combined with pgtest's TestMain; this one
// runs with the same settings.)
var sharedEtcd struct {
	mu     sync.Mutex
	server *embedetcd.Server
	dir    string
	err    error
}

// EtcdEndpoints returns the client URLs of the shared embedded etcd,
// starting it on first use.
func EtcdEndpoints(t testing.TB) []string {
	t.Helper()
	eps, err := etcdEndpoints()
	if err != nil {
		t.Fatalf("lockdtest: start embedded etcd: %v", err)
	}
	return eps
}

func etcdEndpoints() ([]string, error) {
	sharedEtcd.mu.Lock()
	defer sharedEtcd.mu.Unlock()
	if sharedEtcd.server == nil && sharedEtcd.err == nil {
		dir, err := os.MkdirTemp("", "lockdtest-etcd-")
		if err != nil {
			sharedEtcd.err = err
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: dir, TickMs: etcdtest.TickMs, ElectionMs: etcdtest.ElectionMs})
		if err != nil {
			os.RemoveAll(dir)
			sharedEtcd.err = err
			return nil, err
		}
		sharedEtcd.server, sharedEtcd.dir = s, dir
	}
	if sharedEtcd.err != nil {
		return nil, sharedEtcd.err
	}
	return sharedEtcd.server.Endpoints(), nil
}

func stopShared() {
	stopExampleServer()
	sharedEtcd.mu.Lock()
	defer sharedEtcd.mu.Unlock()
	if sharedEtcd.server != nil {
		sharedEtcd.server.Close()
		sharedEtcd.server = nil
	}
	if sharedEtcd.dir != "" {
		os.RemoveAll(sharedEtcd.dir)
		sharedEtcd.dir = ""
	}
}

var prefixSeq atomic.Uint64

// etcdPrefix returns a key prefix no other test of this binary uses.
func etcdPrefix(t testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return fmt.Sprintf("/lockdtest/%d-%s/", prefixSeq.Add(1), name)
}
