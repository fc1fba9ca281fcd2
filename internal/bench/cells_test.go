package bench

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/etcdtest"
	"lock.dev/lockd/store/etcdstore"
)

// idleSystem is a system that does no work: its acquire returns at once
// and commits nothing, so that it counts pairs at any rate it likes. The
// bench must refuse to measure it (the control of checkWork).
type idleSystem struct{}

func (idleSystem) name() string { return "idle-control" }

func (idleSystem) open(context.Context) (locker, error) { return idleSystem{}, nil }

func (idleSystem) acquire(context.Context, string) (func(context.Context) error, error) {
	return func(context.Context) error { return nil }, nil
}

func (idleSystem) close(context.Context) error { return nil }

// TestCellChecksWork measures one tiny distinct cell of etcd-txn and of a
// system that does no work against a real etcd: the first passes, the
// second is refused because etcd's revision did not move.
func TestCellChecksWork(t *testing.T) {
	cli, err := clientv3.New(etcdstore.ClientConfig(etcdtest.Endpoints(t), dialTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const dur = 50 * time.Millisecond
	r := &runner{cfg: Config{Duration: dur}, bed: &bed{backend: BackendEtcd, etcd: cli, run: "cellcheck"}, workerRetries: map[string]int64{}}
	ctx := context.Background()
	cell := func(sys system) (loadResult, error) {
		return r.cell(ctx, scDistinct, sys, 2, "cellcheck", func(ctx context.Context) (loadResult, error) {
			return measure(ctx, sys, 2, dur, "cellcheck", distinctLoad)
		})
	}
	txn := &etcdTxnSystem{cli: cli, prefix: "/" + t.Name() + "/"}
	if res, err := cell(txn); err != nil || res.ops < 2 {
		t.Fatalf("etcd-txn cell = %d pairs, %v; want at least one pair per client and no error", res.ops, err)
	}
	res, err := cell(idleSystem{})
	if err == nil || !strings.Contains(err.Error(), "a system that does no work is not measured") {
		t.Errorf("a system that does no work: %d pairs, %v; want the cell refused", res.ops, err)
	}
}

// TestCPUWindow meters this process over a distinct load's window: the
// window opens and closes once (not in the warm-up), and the load's pairs
// used CPU.
func TestCPUWindow(t *testing.T) {
	w := &cpuWindow{pids: map[string]int{roleClient: os.Getpid()}}
	res, err := measure(withCPUWindow(context.Background(), w), idleSystem{}, 2, 50*time.Millisecond, "t", distinctLoad)
	if err != nil {
		t.Fatal(err)
	}
	used, err := w.used()
	if err != nil || used[roleClient] <= 0 {
		t.Fatalf("cpu used in the window = %v, %v; want the client's > 0", used, err)
	}
	res.cpu = used
	if v := cpuPerOp(res, roleClient); !(v > 0) || math.IsInf(float64(v), 0) {
		t.Errorf("cpu per pair = %v over %d pairs, want > 0", v, res.ops)
	}
	if v := cpuPerOp(res, roleServer); !math.IsNaN(float64(v)) {
		t.Errorf("cpu per pair of an unmetered role = %v, want NaN", v)
	}
	unmetered := &cpuWindow{pids: map[string]int{roleClient: os.Getpid()}}
	windowOpened(withoutCPUWindow(withCPUWindow(context.Background(), unmetered)))
	if _, err := unmetered.used(); err == nil {
		t.Errorf("a window opened under withoutCPUWindow was metered")
	}
}
