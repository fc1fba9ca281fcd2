package client

import (
	"fmt"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// maxLostKeys bounds Session.lostTok; when it is full it starts again
// (what it guards, a grant reply overtaken by its own notice, is also
// caught by the next heartbeat answer).
const maxLostKeys = 4096

// beatState returns what a heartbeat about to be sent carries: the
// session's lockSeq and the notice ids to acknowledge (taken: a lost
// acknowledgement only makes the server repeat its notice).
func (s *Session) beatState(gen uint64) (seq uint64, acks []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ackGen == gen {
		acks = s.acks
	}
	s.acks = nil // acks of an older stream are dropped, never sent here
	return s.lockSeq, acks
}

// beatSeq is the session's lockSeq, for a heartbeat that carries no
// acknowledgements (a stalled stream's, keepalive_shadow.go).
func (s *Session) beatSeq() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lockSeq
}

// fenceLocked records that grants of key up to token are gone (s.mu held).
func (s *Session) fenceLocked(key string, token uint64) {
	if token <= s.lostTok[key] {
		return
	}
	if s.lostTok == nil || len(s.lostTok) >= maxLostKeys {
		s.lostTok = map[string]uint64{}
	}
	s.lostTok[key] = token
}

// lockLost applies a server notice that (key, token) is gone, and queues
// its acknowledgement for the stream numbered gen it came on (none when gen
// is 0: a stream the client left sends nothing more); it reports whether
// one was queued. Tokens of a key
// only rise, so the notice also ends an older grant of the key, and fences
// a grant reply of that token still on its way.
func (s *Session) lockLost(n *lockdv1.LockLost, gen uint64) (ack bool) {
	key, token := n.GetKey(), n.GetToken()
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return false
	}
	if n.GetNoticeId() != 0 && gen != 0 {
		if s.ackGen != gen {
			s.acks, s.ackGen = nil, gen
		}
		s.acks = append(s.acks, n.GetNoticeId())
		ack = true
	}
	s.fenceLocked(key, token)
	l := s.locks[key]
	if l == nil || l.token > token {
		s.mu.Unlock()
		return ack
	}
	delete(s.locks, key)
	s.mu.Unlock()
	why := "gone"
	switch n.GetReason() {
	case lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED:
		why = "revoked"
	case lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED:
		why = "expired"
	case lockdv1.LockLostReason_LOCK_LOST_REASON_SERVER_SHUTDOWN:
		why = "server shutting down"
	case lockdv1.LockLostReason_LOCK_LOST_REASON_MAX_HOLD:
		l.end(fmt.Errorf("%w: revoked by the server", ErrMaxHold))
		return ack
	}
	l.end(fmt.Errorf("%w: %s", ErrLockLost, why))
	return ack
}
