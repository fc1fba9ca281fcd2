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

// Each builder below makes its message, its oneof wrapper and (for
// operations) the RequestOp in one allocation, and the bytes it sends (key,
// range end, value) in one more: clientv3's conversions made a string and a
// []byte of each and an allocation per message (issue 24, "protobuf
// reuse"). The byte slices are capped, so nothing appends into a
// neighbour.

// bytesOf2 copies the strings into one allocation and returns each as a
// capped slice of it.
func bytesOf2(a, b string) ([]byte, []byte) {
	buf := make([]byte, len(a)+len(b))
	n := copy(buf, a)
	copy(buf[n:], b)
	return buf[:n:n], buf[n:]
}

// keyAndEnd returns prefix and the end of its range (clientv3's
// GetPrefixRangeEnd) in one allocation.
func keyAndEnd(prefix string) ([]byte, []byte) {
	buf := make([]byte, 2*len(prefix))
	n := copy(buf, prefix)
	copy(buf[n:], prefix)
	return buf[:n:n], prefixEnd(buf[n:])
}

// keyBytesFor is the key as the bytes a message holds: a string is copied,
// a []byte (keyBytes' slices) used as it is.
func keyBytesFor[K ~string | ~[]byte](key K) []byte { return []byte(key) }

type compareCreate struct {
	c pb.Compare
	u pb.Compare_CreateRevision
}

// cmpCreate compares key's create revision (0: the key does not exist).
func cmpCreate[K ~string | ~[]byte](key K, result pb.Compare_CompareResult, rev int64) *pb.Compare {
	return cmpCreateBytes(keyBytesFor(key), nil, result, rev)
}

func cmpCreateBytes(key, end []byte, result pb.Compare_CompareResult, rev int64) *pb.Compare {
	a := &compareCreate{}
	a.u.CreateRevision = rev
	a.c.Result, a.c.Target, a.c.Key, a.c.RangeEnd, a.c.TargetUnion = result, pb.Compare_CREATE, key, end, &a.u
	return &a.c
}

// cmpCreatePrefix compares the create revision of every key under prefix
// (an empty range compares as a zero key-value).
func cmpCreatePrefix(prefix string, result pb.Compare_CompareResult, rev int64) *pb.Compare {
	key, end := keyAndEnd(prefix)
	return cmpCreateBytes(key, end, result, rev)
}

// cmpMod compares key's mod revision with rev for equality.
func cmpMod[K ~string | ~[]byte](key K, rev int64) *pb.Compare {
	a := &struct {
		c pb.Compare
		u pb.Compare_ModRevision
	}{}
	a.u.ModRevision = rev
	a.c.Result, a.c.Target, a.c.Key, a.c.TargetUnion = pb.Compare_EQUAL, pb.Compare_MOD, keyBytesFor(key), &a.u
	return &a.c
}

// cmpLease compares key's lease with lease.
func cmpLease[K ~string | ~[]byte](key K, result pb.Compare_CompareResult, lease clientv3.LeaseID) *pb.Compare {
	a := &struct {
		c pb.Compare
		u pb.Compare_Lease
	}{}
	a.u.Lease = int64(lease)
	a.c.Result, a.c.Target, a.c.Key, a.c.TargetUnion = result, pb.Compare_LEASE, keyBytesFor(key), &a.u
	return &a.c
}

// reqPut puts key = val attached to lease, returning the previous key-value
// when prevKV.
func reqPut(key, val string, lease clientv3.LeaseID, prevKV bool) *pb.RequestOp {
	k, v := bytesOf2(key, val)
	return reqPutBytes(k, v, lease, prevKV)
}

// reqPutBytes is reqPut of bytes as they are (keyBytes' slices).
func reqPutBytes(key, val []byte, lease clientv3.LeaseID, prevKV bool) *pb.RequestOp {
	a := &struct {
		op pb.RequestOp
		w  pb.RequestOp_RequestPut
		r  pb.PutRequest
	}{}
	a.r.Key, a.r.Value = key, val
	a.r.Lease, a.r.PrevKv = int64(lease), prevKV
	a.w.RequestPut = &a.r
	a.op.Request = &a.w
	return &a.op
}

// reqDelete deletes key.
func reqDelete[K ~string | ~[]byte](key K) *pb.RequestOp {
	a := &struct {
		op pb.RequestOp
		w  pb.RequestOp_RequestDeleteRange
		r  pb.DeleteRangeRequest
	}{}
	a.r.Key = keyBytesFor(key)
	a.w.RequestDeleteRange = &a.r
	a.op.Request = &a.w
	return &a.op
}

type rangeOp struct {
	op pb.RequestOp
	w  pb.RequestOp_RequestRange
	r  pb.RangeRequest
}

func newRangeOp() *rangeOp {
	a := &rangeOp{}
	a.w.RequestRange = &a.r
	a.op.Request = &a.w
	return a
}

// reqGet reads key.
func reqGet[K ~string | ~[]byte](key K) *pb.RequestOp {
	a := newRangeOp()
	a.r.Key = keyBytesFor(key)
	return &a.op
}

// reqFirstUnder reads the oldest key under prefix (by create revision): the
// first in a queue.
func reqFirstUnder(prefix string) *pb.RequestOp {
	key, end := keyAndEnd(prefix)
	return reqFirstIn(key, end)
}

// reqFirstIn is reqFirstUnder of a prefix and its range end as keyBytes
// holds them.
func reqFirstIn(key, end []byte) *pb.RequestOp {
	a := newRangeOp()
	a.r.Key, a.r.RangeEnd = key, end
	a.r.Limit, a.r.SortOrder, a.r.SortTarget = 1, pb.RangeRequest_ASCEND, pb.RangeRequest_CREATE
	return &a.op
}

// reqAnyUnder reads whether any key exists under prefix (one key, no value).
func reqAnyUnder(prefix string) *pb.RequestOp {
	key, end := keyAndEnd(prefix)
	return reqAnyIn(key, end)
}

// reqAnyIn is reqAnyUnder of a prefix and its range end as keyBytes holds
// them.
func reqAnyIn(key, end []byte) *pb.RequestOp {
	a := newRangeOp()
	a.r.Key, a.r.RangeEnd = key, end
	a.r.Limit, a.r.KeysOnly = 1, true
	return &a.op
}

// reqTxn nests a conditional transaction: its compares and operations are
// used as they are, not copied.
func reqTxn(cmps []*pb.Compare, then, els []*pb.RequestOp) *pb.RequestOp {
	a := &struct {
		op pb.RequestOp
		w  pb.RequestOp_RequestTxn
		r  pb.TxnRequest
	}{}
	a.r.Compare, a.r.Success, a.r.Failure = cmps, then, els
	a.w.RequestTxn = &a.r
	a.op.Request = &a.w
	return &a.op
}
