package etcdtest

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ReplyDropper loses the reply of one transaction after etcd applied it, as
// when the connection breaks between etcd's commit and its answer: the
// caller gets UNAVAILABLE and cannot know the outcome. Armed with a key, it
// drops the reply of the next Txn whose success operations delete that key
// (a session record), whichever branch ran; armed with a lease
// (ArmRevoke), the reply of its next LeaseRevoke. Clients from
// NewDropClient go through it.
type ReplyDropper struct {
	mu        sync.Mutex
	key       string // armed: the key whose deleting Txn loses its reply
	lease     int64  // armed: the lease whose LeaseRevoke loses its reply
	succeeded bool   // the dropped Txn's comparisons held (its success branch ran)
	at        time.Time
	dropped   chan struct{} // closed when a reply was dropped
}

// NewDropClient returns a client of the shared server whose unary calls go
// through a new ReplyDropper, closed when the test ends.
func NewDropClient(t testing.TB) (*clientv3.Client, *ReplyDropper) {
	t.Helper()
	d := &ReplyDropper{dropped: make(chan struct{})}
	cfg := ClientConfig(Endpoints(t))
	// Inside clientv3's own retry interceptor (grpc.WithUnaryInterceptor
	// runs first): clientv3 retries a write only for "there is no
	// address available", so the Txn fails once with its outcome unknown.
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(d.intercept))
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("etcdtest: clientv3.New: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, d
}

// Arm makes the next Txn deleting key among its success operations lose
// its reply (once).
func (d *ReplyDropper) Arm(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.key = key
}

// ArmRevoke makes the next LeaseRevoke of etcd lease id lose its reply (once)
// after etcd revoked it. clientv3 retries LeaseRevoke on UNAVAILABLE (a
// repeatable call), so the caller sees the retry's answer: the lease is
// not found.
func (d *ReplyDropper) ArmRevoke(id int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lease = id
}

// Dropped is closed once a reply was dropped.
func (d *ReplyDropper) Dropped() <-chan struct{} { return d.dropped }

// Outcome is what etcd did with the dropped Txn (its success branch ran or
// its failure branch did) and when the reply was dropped; valid once
// Dropped is closed.
func (d *ReplyDropper) Outcome() (succeeded bool, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.succeeded, d.at
}

func (d *ReplyDropper) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch r := req.(type) {
	case *pb.TxnRequest:
		if d.key == "" || !deletes(r.Success, d.key) {
			return nil
		}
		d.key = ""
		d.succeeded = reply.(*pb.TxnResponse).Succeeded
	case *pb.LeaseRevokeRequest:
		if d.lease == 0 || r.ID != d.lease {
			return nil
		}
		d.lease = 0
		d.succeeded = true
	default:
		return nil
	}
	d.at = time.Now()
	select {
	case <-d.dropped: // armed again after a drop: Dropped stays closed
	default:
		close(d.dropped)
	}
	return status.Error(codes.Unavailable, "etcdtest: the reply was dropped after etcd applied the transaction")
}

// deletes reports whether ops delete exactly key.
func deletes(ops []*pb.RequestOp, key string) bool {
	for _, op := range ops {
		if del := op.GetRequestDeleteRange(); del != nil && string(del.Key) == key && len(del.RangeEnd) == 0 {
			return true
		}
	}
	return false
}
