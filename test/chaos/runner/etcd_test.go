package runner

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fakeEtcd stands in for test/cmd/etcd: on the first start etcd1 fails as
// when another process took its port (and etcd0 and etcd2 wait for a
// quorum that never forms); on the second every member serves.
const fakeEtcd = `#!/bin/sh
name=$2; dir=$(dirname "$4")
if [ "$name" = etcd1 ] && [ ! -e "$dir/first" ]; then
	touch "$dir/first"
	echo "etcd: listen tcp 127.0.0.1:1: bind: address already in use" >&2
	exit 1
fi
[ "$name" = etcd1 ] && touch "$dir/second"
while [ ! -e "$dir/second" ]; do sleep 0.05; done
echo "etcd serving endpoints=$6"
exec sleep 600
`

// TestStartEtcdRetriesTakenPort: a member that cannot bind its port ends
// the attempt at once (the members waiting for it are killed, not left
// until etcdReadyTimeout) and the cluster starts again on other ports.
func TestStartEtcdRetriesTakenPort(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "etcd")
	if err := os.WriteFile(bin, []byte(fakeEtcd), 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	nodes, err := startEtcd(bin, dir, 3)
	if err != nil {
		t.Fatalf("startEtcd: %v", err)
	}
	defer func() {
		for _, nd := range nodes {
			if err := nd.stop(); err != nil {
				t.Errorf("stop %s: %v", nd.name, err)
			}
		}
	}()
	// Well inside etcdReadyTimeout (60 s), which the first attempt's
	// waiting members would have run into.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("startEtcd took %v; want the failed attempt ended at once", d)
	}
	if _, err := os.Stat(filepath.Join(dir, "first")); err != nil {
		t.Fatalf("the first attempt did not fail: %v", err)
	}
	for _, nd := range nodes {
		if nd.proc().done() {
			t.Errorf("%s is not running", nd.name)
		}
	}
}
