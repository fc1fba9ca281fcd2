package etcdstore

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The epoch of a prefix (C2 #ct2-fencing). A token is the grant's revision
// shifted so that the prefix's first grant is above the wall-clock time, in
// microseconds, at which the epoch was taken:
//
//	token = E + (revision − C)
//
// where E is the epoch key's value (lockd's wall clock in µs when the first
// Store opened the prefix) and C the epoch key's create revision. A backend
// that lost its data (a new data dir, a new cluster, a new prefix) has no
// epoch key, so its first Store takes a new, later E, and its tokens start
// above every token the old one issued: those were at most the wall-clock
// µs when they were issued, as long as revisions grew by less than 10⁶ a
// second on average. The epoch is written once (a transaction that succeeds
// only if the key does not exist, so concurrent first opens agree), read at
// every open and never changed; every conversion between tokens and
// revisions goes through token and revision below.

// loadEpoch reads the prefix's epoch, taking it first if there is none, and
// returns the shift E − C. With raise (an exclusive Store), an existing
// epoch is raised if needed so that the next revision's token is above now
// in µs: E' = max(E, now − (rev+1) + C), rewritten in place (the create
// revision C stays), guarded by the key's mod revision.
func loadEpoch(ctx context.Context, cli *clientv3.Client, key string, now time.Time, raise bool) (int64, error) {
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, strconv.FormatInt(now.UnixMicro(), 10))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return 0, err
	}
	if resp.Succeeded {
		return now.UnixMicro() - resp.Header.Revision, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return 0, fmt.Errorf("epoch key %q vanished while read", key)
	}
	kv := kvs[0]
	e, err := strconv.ParseInt(string(kv.Value), 10, 64)
	if err != nil || e <= 0 || e > math.MaxInt64/2 {
		return 0, fmt.Errorf("%w: epoch key %q holds %q, not a count of microseconds; "+
			"delete it with every lockd on this prefix stopped and a new epoch is taken (C2 #ct2-fencing)", errMalformed, key, kv.Value)
	}
	shift := e - kv.CreateRevision
	// The rewrite itself takes revision rev+1, so the first grant after it
	// has revision rev+2 at least; the bound below uses rev+1 to be safe.
	if want := now.UnixMicro() - (resp.Header.Revision + 1); raise && want > shift {
		r, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, strconv.FormatInt(want+kv.CreateRevision, 10))).
			Commit()
		if err != nil {
			return 0, err
		}
		if !r.Succeeded {
			return 0, fmt.Errorf("epoch key %q changed while raised: another Store uses the prefix of an exclusive one", key)
		}
		shift = want
	}
	return shift, nil
}

// token is the fencing token of a grant put at revision rev.
func (s *Store) token(rev int64) uint64 { return uint64(s.shift + rev) }

// revision is the revision of the grant with token tok; ok is false for a
// token that no grant under this epoch can have.
func (s *Store) revision(tok uint64) (rev int64, ok bool) {
	if tok > math.MaxInt64 || int64(tok) <= s.shift {
		return 0, false
	}
	return int64(tok) - s.shift, true
}
