package etcdtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/testing/etcdtest"
)

func TestMain(m *testing.M) { etcdtest.Main(m) }

func TestPrefixUnique(t *testing.T) {
	a, b := etcdtest.Prefix(t), etcdtest.Prefix(t)
	if a == b || strings.HasPrefix(a, b) || strings.HasPrefix(b, a) {
		t.Fatalf("Prefix returned %q and %q: want two prefixes where neither starts the other", a, b)
	}
}

// put tries one write with a timeout.
func put(cli *clientv3.Client, key string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := cli.Put(ctx, key, "v")
	return err
}

func TestProxyCutPauseRestore(t *testing.T) {
	key := etcdtest.Prefix(t) + "k"
	p := etcdtest.NewProxy(t)
	cli := etcdtest.NewClient(t, etcdtest.ProxyEndpoint(p))

	if err := put(cli, key, 5*time.Second); err != nil {
		t.Fatalf("Put through the proxy: %v", err)
	}
	for _, mode := range []struct {
		name  string
		start func()
	}{{"cut", p.Cut}, {"pause", p.Pause}} {
		mode.start()
		if err := put(cli, key, 300*time.Millisecond); err == nil {
			t.Fatalf("Put during %s succeeded, want a timeout", mode.name)
		}
		p.Restore()
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := put(cli, key, time.Second)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Put after restoring from %s: still failing after 10s: %v", mode.name, err)
			}
		}
	}
}
