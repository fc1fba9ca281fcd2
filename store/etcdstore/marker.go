package etcdstore

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultMarkerTTL is the TTL of the leases release markers are attached to
// when Options.MarkerTTL is 0. A marker lease takes new markers for half of
// its TTL after it was asked for, so a marker lives at most 1.5 × the TTL
// (plus etcd's expiry check, 500 ms) — 30 s by default — and a Store has at
// most two marker leases alive at a time. See the package doc ("Release
// markers").
const DefaultMarkerTTL = 20 * time.Second

// markerLeases hands out the short lease that release markers of a Store
// are attached to, and replaces it when it has been used for half its TTL.
// Leases are granted lazily (one Grant per rotation, only while markers are
// written), never kept alive and never revoked: each one ends by itself and
// takes its markers along.
type markerLeases struct {
	cli    *clientv3.Client
	ttl    time.Duration // of each lease; 0: markers get no lease (control)
	rotate time.Duration // how long after its Grant was sent a lease takes new markers

	mu   sync.Mutex // held across a Grant, so only one Grant runs per rotation
	id   clientv3.LeaseID
	sent time.Time // when the Grant of id was sent
}

func newMarkerLeases(cli *clientv3.Client, ttl time.Duration) *markerLeases {
	switch {
	case ttl < 0:
		return &markerLeases{cli: cli} // the control: markers stay forever
	case ttl == 0:
		ttl = DefaultMarkerTTL
	}
	ttl = max(ttl.Round(time.Second), time.Second) // etcd leases have whole seconds
	return &markerLeases{cli: cli, ttl: ttl, rotate: ttl / 2}
}

// lease returns the lease to attach a marker written now to: the current
// one if it was asked for less than rotate ago, else a new one. 0 means no
// lease (the control).
func (m *markerLeases) lease(ctx context.Context) (clientv3.LeaseID, error) {
	if m.ttl == 0 {
		return clientv3.NoLease, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.id != clientv3.NoLease && time.Since(m.sent) < m.rotate {
		return m.id, nil
	}
	sent := time.Now()
	resp, err := m.cli.Grant(ctx, int64(m.ttl/time.Second))
	if err != nil {
		return clientv3.NoLease, err
	}
	m.id, m.sent = resp.ID, sent
	return m.id, nil
}

// gone reports whether err says a lease of the transaction no longer
// exists, and if so forgets the marker lease id, so the next marker gets a
// new one. A release, revoke or leave transaction only puts with a lease
// other than the marker's behind compares that hold only while that lease
// exists (the grant or waiter key attached to it), so such an error means
// the marker lease ended early (revoked out of band, or etcd lost it); the
// caller retries.
func (m *markerLeases) gone(err error, id clientv3.LeaseID) bool {
	if err == nil || id == clientv3.NoLease || !errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound) {
		return false
	}
	m.mu.Lock()
	if m.id == id {
		m.id = clientv3.NoLease
	}
	m.mu.Unlock()
	return true
}

// marker returns the operation that writes key's release marker with the
// given reason, on the current marker lease, and that lease.
func (s *Store) marker(ctx context.Context, key, reason string) (clientv3.Op, clientv3.LeaseID, error) {
	id, err := s.marks.lease(ctx)
	if err != nil {
		return clientv3.Op{}, 0, err
	}
	return clientv3.OpPut(s.markerKey(key), reason, clientv3.WithLease(id)), id, nil
}

// releasedValue is markReleased as a request's bytes (shared, read-only).
var releasedValue = []byte(markReleased)

// releaseMarkerPut is marker's put of a release as a protobuf (request.go),
// for the key k names, on the marker lease id from s.marks.lease.
func releaseMarkerPut(k keyBytes, id clientv3.LeaseID) *pb.RequestOp {
	return reqPutBytes(k.marker, releasedValue, id, false)
}
