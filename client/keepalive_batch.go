package client

import (
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// send sends the heartbeats of due on the stream of fl, numbering them from
// *nextID: several at once in one batched request of at most the stream's
// batch_max entries when its server advertised one (C2
// #ct2-keepalive-batch, issue 24), else, and for a lone one, a request
// each. The send time of a batch is read once, just before its message:
// every entry counts its trust from it (C2 #ct2-deadline; the server
// measures each entry's remaining_ms from its own receipt, after that
// send). It reports false when a Send failed.
func (k *keepaliver) send(stream lockdv1.LockService_KeepAliveClient, fl *flight, due []*kaEntry, nextID *uint64) bool {
	most := int(fl.batchMax.Load())
	for len(due) > 0 {
		n := 1
		if most > 1 {
			n = min(most, len(due))
		}
		chunk := due[:n]
		due = due[n:]
		reqs := make([]*lockdv1.KeepAliveRequest, n)
		seqs := make([]uint64, n)
		for i, e := range chunk {
			*nextID++
			seq, acks := e.s.beatState(fl.gen)
			seqs[i] = seq
			reqs[i] = &lockdv1.KeepAliveRequest{SessionId: e.s.id, SessionSecret: e.s.secret, RequestId: *nextID, Ack: acks}
		}
		sent := k.c.clock.Now()
		fl.mu.Lock() // recorded before an answer can arrive
		for i, e := range chunk {
			fl.beats[reqs[i].RequestId] = beat{s: e.s, sent: sent, seq: seqs[i]}
		}
		fl.mu.Unlock()
		msg := reqs[0]
		if n > 1 {
			msg = &lockdv1.KeepAliveRequest{Batch: reqs}
		}
		if err := stream.Send(msg); err != nil {
			return false
		}
	}
	return true
}
