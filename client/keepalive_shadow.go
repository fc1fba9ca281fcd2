package client

import (
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// A stall move keeps sending (C2 #ct2-failover). A stall is a guess: a
// replica that is slow but answering — under load, the first answers of one
// that adopts a session after a move — looks stalled for the stall bound.
// So a stream left because it stalled is not only received on (linger): it
// is still sent every session's heartbeat, one in flight per session there,
// until a stream the client moved to afterwards carries an answer, the
// stalled stream says draining, or it ends. Each such heartbeat is a
// request of its own, and its answer extends trust from its own send time
// with the held set read for it, like any answer (C2 #ct2-deadline). Before,
// the last answer of a slow replica was the session's last when the
// replica moved to was slower still (issue 21).

// maxShadows bounds the stalled streams still sent heartbeats; an older one
// is then only received on.
const maxShadows = 4

// shadow is a stream left because it stalled that is still sent heartbeats
// (owned by the keepaliver's run goroutine).
type shadow struct {
	stream lockdv1.LockService_KeepAliveClient
	fl     *flight
	nextID uint64 // the last request id sent on it
}

// addShadow keeps sending on a stream left because it stalled; nextID is
// the last request id sent on it. The oldest beyond maxShadows stops.
func (k *keepaliver) addShadow(stream lockdv1.LockService_KeepAliveClient, fl *flight, nextID uint64) {
	fl.sending.Store(true)
	k.shadows = append(k.shadows, &shadow{stream: stream, fl: fl, nextID: nextID})
	if len(k.shadows) > maxShadows {
		k.shadows[0].stop()
		k.shadows = k.shadows[1:]
	}
}

// stop ends the sends on sh; its linger then only receives, and ends once
// the heartbeats in flight are answered or forgotten.
func (sh *shadow) stop() {
	sh.fl.sending.Store(false)
	select { // linger looks again
	case sh.fl.answered <- struct{}{}:
	default:
	}
}

// shadowsAfter drops the shadows that stop sending: all of them once the
// current stream (cur) carried an answer, else those whose replica drains
// or whose stream ended.
func (k *keepaliver) shadowsAfter(cur *flight) {
	if len(k.shadows) == 0 {
		return
	}
	cur.mu.Lock()
	replied := cur.replied
	cur.mu.Unlock()
	keep := k.shadows[:0]
	for _, sh := range k.shadows {
		if replied || closed(sh.fl.drain) || closed(sh.fl.gone) {
			sh.stop()
			continue
		}
		keep = append(keep, sh)
	}
	clear(k.shadows[len(keep):])
	k.shadows = keep
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// sendShadows sends the heartbeats of due on every shadow that has none of
// that session's in flight. A failed send stops that shadow (its linger
// learns why from the receive side).
func (k *keepaliver) sendShadows(due []*kaEntry) {
	if len(due) == 0 || len(k.shadows) == 0 {
		return
	}
	keep := k.shadows[:0]
	for _, sh := range k.shadows {
		busy := map[*Session]bool{}
		sh.fl.mu.Lock()
		for _, b := range sh.fl.beats {
			busy[b.s] = true
		}
		sh.fl.mu.Unlock()
		ok := true
		for _, e := range due {
			if busy[e.s] {
				continue
			}
			sh.nextID++
			seq := e.s.beatSeq()
			sent := k.c.clock.Now()
			sh.fl.mu.Lock()
			sh.fl.beats[sh.nextID] = beat{s: e.s, sent: sent, seq: seq}
			sh.fl.mu.Unlock()
			// No acknowledgements: they go only on the stream the client
			// uses (C2 #ct2-failover, Notices).
			if err := sh.stream.Send(&lockdv1.KeepAliveRequest{SessionId: e.s.id, SessionSecret: e.s.secret, RequestId: sh.nextID}); err != nil {
				ok = false
				break
			}
		}
		if !ok {
			sh.stop()
			continue
		}
		keep = append(keep, sh)
	}
	clear(k.shadows[len(keep):])
	k.shadows = keep
}
