package etcdstore

import (
	"math"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// The group commit's requests (batch.go: the grant attempts, releases and
// hand-overs) are built as etcd's protobufs and sent with the KV client of
// clientv3's connection (issue 24). clientv3's Txn/OpTxn clone every Cmp
// with proto.Clone (each Compare and WithPrefix clones again) and convert
// every Op: about 17 % of the server's allocations. Here each compare is
// built once, and a batch nests the requests' own TxnRequests. Other
// requests (reads, sessions, rare paths) keep clientv3's API.

// kvCallOpts are clientv3's default call options (its defaultCallOpts),
// which its KV sends with every call of a client built without
// MaxCallSendMsgSize/MaxCallRecvMsgSize (internal/backend sets neither):
// wait for a ready connection rather than fail fast, 2 MiB per request.
var kvCallOpts = []grpc.CallOption{
	grpc.WaitForReady(true),
	grpc.MaxCallSendMsgSize(2 * 1024 * 1024),
	grpc.MaxCallRecvMsgSize(math.MaxInt32),
}

// newKVClient returns the etcd KV client clientv3's own KV uses on cli's
// connection (its retry interceptor and the dial's interceptors included).
func newKVClient(cli *clientv3.Client) pb.KVClient { return clientv3.RetryKVClient(cli) }

// cmpCreate compares key's create revision (0: the key does not exist).
func cmpCreate(key string, result pb.Compare_CompareResult, rev int64) *pb.Compare {
	return &pb.Compare{Result: result, Target: pb.Compare_CREATE, Key: []byte(key),
		TargetUnion: &pb.Compare_CreateRevision{CreateRevision: rev}}
}

// cmpCreatePrefix compares the create revision of every key under prefix
// (an empty range compares as a zero key-value).
func cmpCreatePrefix(prefix string, result pb.Compare_CompareResult, rev int64) *pb.Compare {
	c := cmpCreate(prefix, result, rev)
	c.RangeEnd = []byte(clientv3.GetPrefixRangeEnd(prefix))
	return c
}

// cmpMod compares key's mod revision with rev for equality.
func cmpMod(key string, rev int64) *pb.Compare {
	return &pb.Compare{Result: pb.Compare_EQUAL, Target: pb.Compare_MOD, Key: []byte(key),
		TargetUnion: &pb.Compare_ModRevision{ModRevision: rev}}
}

// cmpLease compares key's lease with lease.
func cmpLease(key string, result pb.Compare_CompareResult, lease clientv3.LeaseID) *pb.Compare {
	return &pb.Compare{Result: result, Target: pb.Compare_LEASE, Key: []byte(key),
		TargetUnion: &pb.Compare_Lease{Lease: int64(lease)}}
}

// reqPut puts key = val attached to lease, returning the previous key-value
// when prevKV.
func reqPut(key, val string, lease clientv3.LeaseID, prevKV bool) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
		Key: []byte(key), Value: []byte(val), Lease: int64(lease), PrevKv: prevKV}}}
}

// reqDelete deletes key.
func reqDelete(key string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{
		Key: []byte(key)}}}
}

// reqGet reads key.
func reqGet(key string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(key)}}}
}

// reqFirstUnder reads the oldest key under prefix (by create revision): the
// first in a queue.
func reqFirstUnder(prefix string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{
		Key: []byte(prefix), RangeEnd: []byte(clientv3.GetPrefixRangeEnd(prefix)), Limit: 1,
		SortOrder: pb.RangeRequest_ASCEND, SortTarget: pb.RangeRequest_CREATE}}}
}

// reqAnyUnder reads whether any key exists under prefix (one key, no value).
func reqAnyUnder(prefix string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{
		Key: []byte(prefix), RangeEnd: []byte(clientv3.GetPrefixRangeEnd(prefix)), Limit: 1, KeysOnly: true}}}
}

// reqTxn nests a conditional transaction: its compares and operations are
// used as they are, not copied.
func reqTxn(cmps []*pb.Compare, then, els []*pb.RequestOp) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
		Compare: cmps, Success: then, Failure: els}}}
}
