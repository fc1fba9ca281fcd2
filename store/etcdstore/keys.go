package etcdstore

import (
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/store"
)

// The key layout: every key this package writes lives under the Store's
// prefix P in one of these spaces, and every key is built and parsed by the
// functions of this file. The package doc's "Key layout" lists the same
// spaces (TestKeyLayoutDoc checks that the two agree, and that no other
// file builds a key from a literal). A new space goes here, into keySpaces
// and the doc; if it sorts inside the held index's range it must also be
// in heldSpaces or heldSkipped (TestHeldRange), so it cannot join the index
// unnoticed.
const (
	// spaceGrant: l/<key> a plain grant; l/<key>\x00 its release or value
	// marker (marker.go).
	spaceGrant = "l/"
	// spaceMulti: m/<key>\x00s<id> a semaphore or read/write slot,
	// m/<key>\x00w<id> a waiter, m/<key>\x00v<id> a slot's value (multi.go).
	spaceMulti = "m/"
	// spaceQueue: q/<key>\x00<id> a waiter of a plain lock (wait.go); its
	// value is the session id, followed by " no-deadlock-check" when it
	// opted out of deadlock refusal (deadlock.go).
	spaceQueue = "q/"
	// spaceSession: s/<id> a session record, s/<id>\x00<instance> a keeper
	// record (record.go).
	spaceSession = "s/"
	// spaceHolder: h/<id> a session's owner and labels (holder.go).
	spaceHolder = "h/"
	// spaceValue: v/<key> a plain grant's value (holder.go).
	spaceValue = "v/"
	// spaceDelay: d/<key> a lock-delay record (delay.go).
	spaceDelay = "d/"
	// spaceCompanion: c/<id>\x00<d ms> a session's companion lease
	// (delay.go).
	spaceCompanion = "c/"
	// spaceEnd: e/<id> the end marker of session <id>: the Store that
	// records the session's end (end.go).
	spaceEnd = "e/"
	// epochName is the key where the prefix's epoch is kept (epoch.go).
	epochName = "epoch"
)

// keySpaces lists every space, in the order of the package doc's layout.
var keySpaces = []string{spaceGrant, epochName, spaceQueue, spaceSession, spaceHolder, spaceValue, spaceMulti,
	spaceDelay, spaceCompanion, spaceEnd}

// heldSpaces are the spaces the held index keeps (held.go): plain grants,
// slots and session records. heldSkipped are the spaces that sort between
// them, which the index reads and skips.
var (
	heldSpaces  = []string{spaceGrant, spaceMulti, spaceSession}
	heldSkipped = []string{spaceQueue}
)

// heldRange is the range [from, end) the held index reads and watches:
// from the first of heldSpaces to past the last.
func (s *Store) heldRange() (from, end string) {
	return s.prefix + slices.Min(heldSpaces), clientv3.GetPrefixRangeEnd(s.prefix + slices.Max(heldSpaces))
}

// Keys of each space, and the parsers of the ones read back.

func (s *Store) lockKey(key string) string   { return s.prefix + spaceGrant + key }
func (s *Store) markerKey(key string) string { return s.prefix + spaceGrant + key + "\x00" }
func (s *Store) queuePrefix(key string) string {
	return s.prefix + spaceQueue + key + "\x00"
}
func (s *Store) waiterKey(key string, id store.SessionID) string {
	return s.queuePrefix(key) + string(id)
}

// keyBytes are the etcd keys of one lockd key that its grant attempts and
// releases name (request.go), built in one allocation rather than a string
// and a copy each (issue 24): the grant key, its marker, its lock-delay
// record, and its queue's and slots' prefixes with the ends of their
// ranges. The slices share one array, each capped: read them, never append.
type keyBytes struct {
	lock, marker, delay []byte
	queue, queueEnd     []byte
	multi, multiEnd     []byte
}

func (s *Store) keyBytesOf(key string) keyBytes {
	grant := len(s.prefix) + len(spaceGrant) + len(key) + 1 // l/<key>\x00 (its prefix is the grant key)
	delay := len(s.prefix) + len(spaceDelay) + len(key)
	queue := len(s.prefix) + len(spaceQueue) + len(key) + 1
	multi := len(s.prefix) + len(spaceMulti) + len(key) + 1
	buf := make([]byte, 0, grant+delay+2*queue+2*multi)
	var k keyBytes
	i := len(buf)
	buf = append(append(append(append(buf, s.prefix...), spaceGrant...), key...), 0)
	k.marker = buf[i:len(buf):len(buf)]
	k.lock = k.marker[: grant-1 : grant-1]
	i = len(buf)
	buf = append(append(append(buf, s.prefix...), spaceDelay...), key...)
	k.delay = buf[i:len(buf):len(buf)]
	i = len(buf)
	buf = append(append(append(append(buf, s.prefix...), spaceQueue...), key...), 0)
	k.queue = buf[i:len(buf):len(buf)]
	i = len(buf)
	buf = append(buf, k.queue...)
	k.queueEnd = prefixEnd(buf[i:len(buf):len(buf)])
	i = len(buf)
	buf = append(append(append(append(buf, s.prefix...), spaceMulti...), key...), 0)
	k.multi = buf[i:len(buf):len(buf)]
	i = len(buf)
	buf = append(buf, k.multi...)
	k.multiEnd = prefixEnd(buf[i:len(buf):len(buf)])
	return k
}

// prefixEnd turns b, a copy of a prefix, into the end of the prefix's range
// in place (clientv3's GetPrefixRangeEnd); a prefix of only 0xff bytes
// ranges to the end of the key space.
func prefixEnd(b []byte) []byte {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return b[: i+1 : i+1]
		}
	}
	return []byte{0}
}

// grantSpace, queueSpace and multiSpace start every plain grant key, every
// plain waiter key and every semaphore or read/write key (the deadlock
// detector's read, deadlock.go).
func (s *Store) grantSpace() string { return s.prefix + spaceGrant }
func (s *Store) queueSpace() string { return s.prefix + spaceQueue }
func (s *Store) multiSpace() string { return s.prefix + spaceMulti }

// parseMultiKey returns the lockd key of a semaphore or read/write key
// (m/<key>\x00<kind><id>) and its kind: 's' a slot, 'w' a waiter, 'v' a
// slot's value. Keys hold no NUL, so the first NUL ends the key.
func (s *Store) parseMultiKey(etcdKey []byte) (key string, kind byte, ok bool) {
	rest, ok := strings.CutPrefix(string(etcdKey), s.multiSpace())
	if !ok {
		return "", 0, false
	}
	key, tail, ok := strings.Cut(rest, "\x00")
	if !ok || len(tail) < 2 {
		return "", 0, false
	}
	return key, tail[0], true
}

// parseWaiterKey returns the lockd key and session of a plain waiter key.
// Keys and session ids hold no NUL, so the one NUL splits them.
func (s *Store) parseWaiterKey(etcdKey []byte) (key string, id store.SessionID, ok bool) {
	rest, ok := strings.CutPrefix(string(etcdKey), s.queueSpace())
	if !ok {
		return "", "", false
	}
	key, sid, ok := strings.Cut(rest, "\x00")
	if !ok || sid == "" {
		return "", "", false
	}
	return key, store.SessionID(sid), true
}

// userKey turns an etcd lock key back into the lockd key; ok is false for
// markers and keys outside the lock space.
func (s *Store) userKey(etcdKey []byte) (string, bool) {
	k, ok := strings.CutPrefix(string(etcdKey), s.prefix+spaceGrant)
	if !ok || strings.IndexByte(k, 0) >= 0 {
		return "", false
	}
	return k, true
}

func (s *Store) recordKey(id store.SessionID) string { return s.prefix + spaceSession + string(id) }

// keeperPrefix starts the keeper records of session id; keeperKey is this
// Store's. Session ids are printable ASCII, so the NUL ends the id.
func (s *Store) keeperPrefix(id store.SessionID) string { return s.recordKey(id) + "\x00" }
func (s *Store) keeperKey(id store.SessionID) string    { return s.keeperPrefix(id) + s.inst }

func (s *Store) holderKey(id store.SessionID) string { return s.prefix + spaceHolder + string(id) }
func (s *Store) endKey(id store.SessionID) string    { return s.prefix + spaceEnd + string(id) }
func (s *Store) valueKey(key string) string          { return s.prefix + spaceValue + key }

func (s *Store) delayKey(key string) string { return s.prefix + spaceDelay + key }

// companionPrefix starts the companion records of session id: one
// c/<id>\x00<d ms> = "<lease id>" per companion lease, on the session's
// lease, written with each delay record (SetGrantPolicy). A Store that
// adopts the session reads them and keeps those leases alive too, so a
// lock-delay outlives the replica that set it (C2 #ct2-delay). Session ids
// are printable ASCII, so the NUL ends the id.
func (s *Store) companionPrefix(id store.SessionID) string {
	return s.prefix + spaceCompanion + string(id) + "\x00"
}

func (s *Store) companionKey(id store.SessionID, d time.Duration) string {
	return s.companionPrefix(id) + strconv.FormatInt(d.Milliseconds(), 10)
}

func (s *Store) multiPrefix(key string) string { return s.prefix + spaceMulti + key + "\x00" }
func (s *Store) slotKey(key string, id store.SessionID) string {
	return s.multiPrefix(key) + "s" + string(id)
}
func (s *Store) mwaiterKey(key string, id store.SessionID) string {
	return s.multiPrefix(key) + "w" + string(id)
}

// isSlotKey reports whether an etcd key is a slot key (LocksOf reads it).
func (s *Store) isSlotKey(k []byte) bool {
	rest, ok := strings.CutPrefix(string(k), s.prefix+spaceMulti)
	if !ok {
		return false
	}
	_, tail, ok := strings.Cut(rest, "\x00")
	return ok && strings.HasPrefix(tail, "s")
}

// recordID returns the session id of a session record key (not of a keeper
// record).
func (s *Store) recordID(k []byte) (store.SessionID, bool) {
	id, ok := strings.CutPrefix(string(k), s.prefix+spaceSession)
	if !ok || id == "" || strings.IndexByte(id, 0) >= 0 {
		return "", false
	}
	return store.SessionID(id), true
}
