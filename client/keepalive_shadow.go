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
// stalled stream says draining, or it ends ("answers": a live answer to a
// heartbeat; a notice or an error answer does not show that the replica
// moved to keeps the session). Each such heartbeat is a
// request of its own, and its answer extends trust from its own send time
// with the held set read for it, like any answer (C2 #ct2-deadline). Before,
// the last answer of a slow replica was the session's last when the
// replica moved to was slower still (issue 21).

// maxShadows bounds the stalled streams still sent heartbeats; an older one
// is then only received on.
const maxShadows = 4

// shadowQueue bounds the heartbeats waiting for a shadow's sender; more are
// dropped (a heartbeat not sent is always safe).
const shadowQueue = 256

// shadow is a stream left because it stalled that is still sent heartbeats
// (owned by the keepaliver's run goroutine). Its own goroutine sends them:
// a replica that hangs stops granting flow control, and a Send to it must
// never hold up the heartbeats of the stream in use.
type shadow struct {
	stream lockdv1.LockService_KeepAliveClient
	fl     *flight
	nextID uint64                         // the last request id sent on it
	reqs   chan *lockdv1.KeepAliveRequest // to its sender; closed by stop
}

// addShadow keeps sending on a stream left because it stalled; nextID is
// the last request id sent on it. The oldest beyond maxShadows stops.
func (k *keepaliver) addShadow(stream lockdv1.LockService_KeepAliveClient, fl *flight, nextID uint64) {
	fl.sending.Store(true)
	sh := &shadow{stream: stream, fl: fl, nextID: nextID, reqs: make(chan *lockdv1.KeepAliveRequest, shadowQueue)}
	k.c.wg.Add(1)
	go k.shadowSend(sh) // exits when stop closes reqs, a Send fails, or the stream's context ends (linger, Close)
	k.shadows = append(k.shadows, sh)
	if len(k.shadows) > maxShadows {
		k.shadows[0].stop()
		k.shadows = k.shadows[1:]
	}
}

// shadowSend is a shadow's sender goroutine.
func (k *keepaliver) shadowSend(sh *shadow) {
	defer k.c.wg.Done()
	done := sh.stream.Context().Done()
	for {
		select {
		case req, ok := <-sh.reqs:
			if !ok {
				return
			}
			if err := sh.stream.Send(req); err != nil {
				return // the stream ended: its linger learns why from the receive side
			}
		case <-done:
			return
		}
	}
}

// stop ends the sends on sh (run goroutine, once); its linger then only
// receives, and ends once the heartbeats in flight are answered or
// forgotten.
func (sh *shadow) stop() {
	sh.fl.sending.Store(false)
	close(sh.reqs)
	select { // linger looks again
	case sh.fl.answered <- struct{}{}:
	default:
	}
}

// shadowsAfter drops the shadows that stop sending: all of them once the
// current stream (cur) carried a live answer to a heartbeat (kept: a notice
// or an error answer is not one), else those whose replica drains or whose
// stream ended.
func (k *keepaliver) shadowsAfter(cur *flight) {
	if len(k.shadows) == 0 {
		return
	}
	cur.mu.Lock()
	kept := cur.kept
	cur.mu.Unlock()
	keep := k.shadows[:0]
	for _, sh := range k.shadows {
		if kept || closed(sh.fl.drain) || closed(sh.fl.gone) {
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

// sendShadows hands every shadow the heartbeats of due whose session has
// none in flight there. A heartbeat unanswered there for a TTL is forgotten
// first, as on any stream (C2 #ct2-failover): a replica that answers
// nothing must not keep a session out of the sends for good. The send time
// is taken here, before the sender's Send: earlier than the real send,
// which only shortens the trust an answer gives (C2 #ct2-deadline). A
// heartbeat the queue has no room for is not sent. The shadow's linger is
// poked after a send, so that it arms its timer to forget it (with nothing
// else in flight it waits without one).
func (k *keepaliver) sendShadows(due []*kaEntry) {
	if len(due) == 0 {
		return
	}
	now := k.c.clock.Now()
	for _, sh := range k.shadows {
		busy := map[*Session]bool{}
		sh.fl.mu.Lock()
		for id, b := range sh.fl.beats {
			if !now.Before(b.sent.Add(b.s.ttl)) {
				delete(sh.fl.beats, id)
				continue
			}
			busy[b.s] = true
		}
		sh.fl.mu.Unlock()
		sent := false
		for _, e := range due {
			if busy[e.s] {
				continue
			}
			// No acknowledgements: they go only on the stream the client
			// uses (C2 #ct2-failover, Notices).
			sh.nextID++
			id := sh.nextID
			seq := e.s.beatSeq()
			sh.fl.mu.Lock() // recorded before its answer can arrive
			sh.fl.beats[id] = beat{s: e.s, sent: k.c.clock.Now(), seq: seq}
			sh.fl.mu.Unlock()
			select {
			case sh.reqs <- &lockdv1.KeepAliveRequest{SessionId: e.s.id, SessionSecret: e.s.secret, RequestId: id}:
				sent = true
			default:
				sh.fl.mu.Lock()
				delete(sh.fl.beats, id)
				sh.fl.mu.Unlock()
			}
		}
		if sent {
			select { // linger looks again: a timer to forget what was sent
			case sh.fl.answered <- struct{}{}:
			default:
			}
		}
	}
}
