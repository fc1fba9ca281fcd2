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
