package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/store"
)

// Holder identity (C2 #ct2-holder). A session opened with an owner or labels
// has a holder record h/<session id> on its lease; a grant's value is a
// record v/<key> = "<token> <value>" on the holder's lease. Both are read by
// every instance; neither touches the grant key, whose mod revision is the
// fencing token.

// holderRecord is the JSON of a holder record.
type holderRecord struct {
	Owner  string            `json:"o,omitempty"`
	Labels map[string]string `json:"l,omitempty"`
}

// SetValue implements store.ValueSetter: it writes key's value record iff
// the grant key still has token's revision and the session's lease, and in
// the same revision the key's marker "value <session> <token>", which Watch
// reports as a value event.
func (s *Store) SetValue(ctx context.Context, id store.SessionID, key string, token uint64, value []byte) error {
	if err := store.ValidateKey(key); err != nil {
		return fmt.Errorf("etcdstore: set value: %w", err)
	}
	if err := store.ValidateValue(value); err != nil {
		return fmt.Errorf("etcdstore: set value: %w", err)
	}
	notOwner := fmt.Errorf("%w: etcdstore: set value %q: token %d is not the current grant of session %s", store.ErrNotOwner, key, token, id)
	ss, err := s.live(ctx, id)
	rev, issued := s.revision(token)
	if errors.Is(err, store.ErrSessionDead) || (err == nil && !issued) {
		return notOwner
	}
	if err != nil {
		return fmt.Errorf("etcdstore: set value: %w", err)
	}
	if s.isMulti(ss, key) {
		return s.setValueMulti(ctx, ss, key, token, value, notOwner) // multi.go
	}
	lk := s.lockKey(key)
	resp, err := s.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(lk), "=", rev),
		clientv3.Compare(clientv3.LeaseValue(lk), "=", ss.lease),
	).Then(
		clientv3.OpPut(s.valueKey(key), strconv.FormatUint(token, 10)+" "+string(value), clientv3.WithLease(ss.lease)),
		// The value event of Watch (C2 #ct2-watch): a marker under the
		// watched grant keys, on the holder's lease like the value.
		clientv3.OpPut(s.markerKey(key), markValue+string(id)+" "+strconv.FormatUint(token, 10), clientv3.WithLease(ss.lease)),
	).Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: set value: %w", classify(ctx, err))
	}
	if !resp.Succeeded {
		return notOwner
	}
	return nil
}

// fillHolders reads, at revision rev, the holder records and values of
// infos and fills them in. One transaction of point reads.
func (s *Store) fillHolders(ctx context.Context, rev int64, infos []store.LockInfo) error {
	if len(infos) == 0 {
		return nil
	}
	ops := make([]clientv3.Op, 0, 3*len(infos))
	for _, in := range infos {
		ops = append(ops, clientv3.OpGet(s.holderKey(in.Session), clientv3.WithRev(rev)), clientv3.OpGet(s.valueKey(in.Key), clientv3.WithRev(rev)),
			clientv3.OpGet(s.delayKey(in.Key), clientv3.WithRev(rev)))
	}
	// etcd bounds the operations of one transaction (128 by default).
	const maxOps = 126 // a multiple of 3
	for i := 0; i < len(ops); i += maxOps {
		resp, err := s.cli.Txn(ctx).Then(ops[i:min(i+maxOps, len(ops))]...).Commit()
		if err != nil {
			return classify(ctx, err)
		}
		for j, r := range resp.Responses {
			n := i + j
			in := &infos[n/3]
			kvs := r.GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			if n%3 == 2 { // the delay record (delay.go)
				if tok, d, ok := parseDelay(kvs[0].Value); ok && tok == in.Token {
					in.LockDelay = d
				}
				continue
			}
			if n%3 == 0 {
				var h holderRecord
				if json.Unmarshal(kvs[0].Value, &h) == nil {
					in.Owner, in.Labels = h.Owner, h.Labels
				}
				continue
			}
			tok, v, ok := strings.Cut(string(kvs[0].Value), " ")
			if t, err := strconv.ParseUint(tok, 10, 64); ok && err == nil && t == in.Token && v != "" {
				in.Value = []byte(v)
			}
		}
	}
	return nil
}
