package etcdstore

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// TestCompareBuilders: the compares request.go builds are the ones
// clientv3.Compare builds for the same condition (issue 24 replaced the
// latter on the group commit's paths).
func TestCompareBuilders(t *testing.T) {
	const lease clientv3.LeaseID = 0x1234
	for _, c := range []struct {
		name string
		got  *pb.Compare
		want clientv3.Cmp
	}{
		{"create = 0", cmpCreate("/p/g/k", pb.Compare_EQUAL, 0), clientv3.Compare(clientv3.CreateRevision("/p/g/k"), "=", 0)},
		{"create = rev", cmpCreate("/p/q/k/s", pb.Compare_EQUAL, 42), clientv3.Compare(clientv3.CreateRevision("/p/q/k/s"), "=", 42)},
		{"prefix create = 0", cmpCreatePrefix("/p/q/k/", pb.Compare_EQUAL, 0), clientv3.Compare(clientv3.CreateRevision("/p/q/k/"), "=", 0).WithPrefix()},
		{"prefix create > rev", cmpCreatePrefix("/p/q/k/", pb.Compare_GREATER, 41), clientv3.Compare(clientv3.CreateRevision("/p/q/k/"), ">", 41).WithPrefix()},
		{"mod = rev", cmpMod("/p/g/k", 42), clientv3.Compare(clientv3.ModRevision("/p/g/k"), "=", 42)},
		{"lease =", cmpLease("/p/g/k", pb.Compare_EQUAL, lease), clientv3.Compare(clientv3.LeaseValue("/p/g/k"), "=", lease)},
		{"lease !=", cmpLease("/p/g/k", pb.Compare_NOT_EQUAL, lease), clientv3.Compare(clientv3.LeaseValue("/p/g/k"), "!=", lease)},
	} {
		if want := c.want.GetCompare(); !proto.Equal(c.got, want) {
			t.Errorf("%s: built %v; clientv3 builds %v", c.name, c.got, want)
		}
	}
}

// TestRequestBuilders: the operations request.go builds in one allocation
// are the messages built field by field, and the range ends are clientv3's.
func TestRequestBuilders(t *testing.T) {
	const lease clientv3.LeaseID = 0x1234
	rangeOp := func(r *pb.RangeRequest) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}}
	}
	end := func(p string) []byte { return []byte(clientv3.GetPrefixRangeEnd(p)) }
	modCmp := clientv3.Compare(clientv3.ModRevision("/p/g/k"), "=", 3)
	for _, c := range []struct {
		name      string
		got, want *pb.RequestOp
	}{
		{"put", reqPut("/p/g/k", "s 12", lease, false), &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
			Key: []byte("/p/g/k"), Value: []byte("s 12"), Lease: int64(lease)}}}},
		{"put prev", reqPut("/p/q/k\x00s", "s", lease, true), &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
			Key: []byte("/p/q/k\x00s"), Value: []byte("s"), Lease: int64(lease), PrevKv: true}}}},
		{"delete", reqDelete("/p/g/k"), &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{
			Key: []byte("/p/g/k")}}}},
		{"get", reqGet("/p/g/k"), rangeOp(&pb.RangeRequest{Key: []byte("/p/g/k")})},
		{"first under", reqFirstUnder("/p/q/k\x00"), rangeOp(&pb.RangeRequest{Key: []byte("/p/q/k\x00"), RangeEnd: end("/p/q/k\x00"),
			Limit: 1, SortOrder: pb.RangeRequest_ASCEND, SortTarget: pb.RangeRequest_CREATE})},
		{"any under", reqAnyUnder("/p/m/k\x00"), rangeOp(&pb.RangeRequest{Key: []byte("/p/m/k\x00"), RangeEnd: end("/p/m/k\x00"),
			Limit: 1, KeysOnly: true})},
		{"txn", reqTxn([]*pb.Compare{cmpMod("/p/g/k", 3)}, []*pb.RequestOp{reqDelete("/p/g/k")}, []*pb.RequestOp{reqGet("/p/g/k")}),
			&pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
				Compare: []*pb.Compare{modCmp.GetCompare()},
				Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("/p/g/k")}}}},
				Failure: []*pb.RequestOp{rangeOp(&pb.RangeRequest{Key: []byte("/p/g/k")})}}}}},
	} {
		if !proto.Equal(c.got, c.want) {
			t.Errorf("%s: built %v; want %v", c.name, c.got, c.want)
		}
	}
	for _, p := range []string{"/p/q/k\x00", "a", "a\xff", "a\xff\xff", "\xff", "\xff\xff", "ab\xfe\xff"} {
		key, got := keyAndEnd(p)
		if string(key) != p || string(got) != clientv3.GetPrefixRangeEnd(p) {
			t.Errorf("keyAndEnd(%q) = %q, %q; want %q, %q", p, key, got, p, clientv3.GetPrefixRangeEnd(p))
		}
		if cap(key) != len(key) {
			t.Errorf("keyAndEnd(%q): the key's capacity %d reaches into its range end", p, cap(key))
		}
	}
	k, v := bytesOf2("key", "value")
	if string(k) != "key" || string(v) != "value" || cap(k) != len(k) {
		t.Errorf("bytesOf2 = %q (cap %d), %q", k, cap(k), v)
	}
}

// sink and sinkBytes keep the builders' results on the heap in the
// allocation tests.
var (
	sink      any
	sinkBytes []byte
)

// TestRequestAllocations guards the builders' allocations (issue 24): one
// for a message with its wrappers, one for the bytes it sends. The
// builders before made 3 for a compare, 4 for a prefix compare, 5 for a put
// and 3 for a nested Txn.
func TestRequestAllocations(t *testing.T) {
	for _, c := range []struct {
		name string
		want float64
		f    func()
	}{
		{"cmpCreate", 2, func() { sink = cmpCreate("/p/g/k", pb.Compare_EQUAL, 0) }},
		{"cmpCreatePrefix", 2, func() { sink = cmpCreatePrefix("/p/q/k\x00", pb.Compare_EQUAL, 0) }},
		{"cmpMod", 2, func() { sink = cmpMod("/p/g/k", 7) }},
		{"cmpLease", 2, func() { sink = cmpLease("/p/g/k", pb.Compare_EQUAL, 7) }},
		{"reqPut", 2, func() { sink = reqPut("/p/g/k", "v", 7, false) }},
		{"reqDelete", 2, func() { sink = reqDelete("/p/g/k") }},
		{"reqGet", 2, func() { sink = reqGet("/p/g/k") }},
		{"reqFirstUnder", 2, func() { sink = reqFirstUnder("/p/q/k\x00") }},
		{"reqAnyUnder", 2, func() { sink = reqAnyUnder("/p/m/k\x00") }},
		{"reqTxn", 1, func() { sink = reqTxn(nil, nil, nil) }},
	} {
		if got := testing.AllocsPerRun(100, c.f); got != c.want {
			t.Errorf("%s: %.0f allocations; want %.0f", c.name, got, c.want)
		}
	}
}

// TestKeyBytes: keyBytesOf builds the keys and range ends of keys.go's
// string builders and clientv3's GetPrefixRangeEnd, each capped, in one
// allocation.
func TestKeyBytes(t *testing.T) {
	s := &Store{prefix: "/lockd/"}
	for _, key := range []string{"k", "a/b/c", "\xff\xfe"} {
		k := s.keyBytesOf(key)
		for _, c := range []struct {
			name string
			got  []byte
			want string
		}{
			{"lock", k.lock, s.lockKey(key)},
			{"marker", k.marker, s.markerKey(key)},
			{"delay", k.delay, s.delayKey(key)},
			{"queue", k.queue, s.queuePrefix(key)},
			{"queue end", k.queueEnd, clientv3.GetPrefixRangeEnd(s.queuePrefix(key))},
			{"multi", k.multi, s.multiPrefix(key)},
			{"multi end", k.multiEnd, clientv3.GetPrefixRangeEnd(s.multiPrefix(key))},
		} {
			if string(c.got) != c.want || cap(c.got) != len(c.got) {
				t.Errorf("%q: %s = %q (cap %d); want %q, capped", key, c.name, c.got, cap(c.got), c.want)
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { k := s.keyBytesOf("a/b/c"); sinkBytes = k.lock }); n != 1 {
		t.Errorf("keyBytesOf: %.0f allocations; want 1", n)
	}
}
