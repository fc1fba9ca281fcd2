// Package etcdstore is lockd's etcd backend (store.LockStore over
// go.etcd.io/etcd/client/v3).
//
// # Sessions and leases
//
// A session is exactly one etcd lease. OpenSession grants it with the
// session's TTL rounded up to whole seconds (Session.TTL reports the TTL etcd
// applied) and returns a random session id. The id → lease mapping lives in
// the session record s/<id> on the lease (with the TTL, the secret hash and
// the principal), so every Store on the prefix can use every live session: a
// Store that gets a call for a session it does not know adopts it from the
// record (one read, then cached in its session map) and keeps its lease alive
// too (record.go, C2 #ct2-replicas). A lease id never leaves this package. Every
// key a session writes — grant keys and waiter keys — is attached to its lease, so
// the lease's end is the one mechanism that frees all of them at once: an
// out-of-band revoke, expiry, CloseSession.
//
// # Keepalive and the deadline bound (C2 #ct2-deadline)
//
// A Store keeps the leases of its sessions alive itself, over ONE
// bidirectional LeaseKeepAlive stream per Store (opened with
// etcdserverpb.NewLeaseClient on the client's connection) that multiplexes
// all of them, with at most one keepalive in flight per lease. That is what
// makes Heartbeat's Remaining provable: a keepalive sent at s and answered
// with TTL T keeps the lease until at least s+T (etcd extends from when it
// receives it, which is later), and with one request in flight per lease
// every answer is matched to the send time recorded for it. Remaining is
// (send time of the last answered keepalive) + (TTL in that answer) − (time
// the call was received), on the monotonic clock. clientv3's Lease.KeepAlive
// is not used: its channel reports an answer's TTL but not when the answered
// request was sent, and it re-sends while an answer is late, so no such bound
// can be derived from it (docs/safety.md, "Three lifetimes of one session":
// the server grant).
//
// The keepalive of a lease goes out a third of its TTL (at most three
// seconds) after the previous one was sent, so a lease revoked behind
// lockd's back is noticed within about three seconds. An answer overdue by
// more than a third of the TTL tears the stream down; a new one is opened
// with backoff and requests on the old one are void. When
// a session's bound runs out, the Store probes the lease once with
// TimeToLive: a positive TTL gives a fresh bound (probe send time + TTL); a
// missing lease makes the session dead (reason lease_expired); no answer
// makes it dead too (reason keepalive_failed), because nobody can show the
// lease alive any more and etcd may already have freed its keys. The Store
// then revokes the lease once etcd answers again (bounded retries), so its
// keys do not linger. A permanent outage thus reports a session not-live
// within about its TTL, while an outage shorter than the TTL is only
// reported as a retryable error.
//
// Not-live is terminal: a dead session is never reported live again, and an
// unknown session id is reported not-live.
//
// # Keepalive interval
//
// Every keepalive costs etcd and lockd a message each way, so the interval,
// min(TTL/3, 3 s), is what idle sessions cost (the figures are in
// docs/backends.md). The interval does not weaken the timing argument
// (docs/safety.md, "The timing chain"). Remaining is still the send time of
// the last ANSWERED keepalive plus the TTL in its answer, minus now: a longer
// interval only lets that bound run lower before it is refreshed, so the
// client is promised less, never more. An unanswered keepalive still extends
// nothing, an answer overdue by TTL/3 still replaces the stream, and a bound
// that runs out still leads to a probe and, without an answer, to not-live.
// What the interval does set is how soon an out-of-band revoke of the lease is
// noticed (the next answer says the lease is gone): within about three
// seconds. Sends are also aligned to a 100 ms grid (a send is due at the first
// tick after its interval): the keepalive owner then wakes at most ten times a
// second and sends what is due together, instead of once per lease. That
// delays a send by under a tick, which again only lets the bound run lower.
//
// # Ownership and locks
//
// Each piece of a Store's state has one owner with its own lock: the
// session table (Store.mu: the sessions map and each session's liveness and
// grant record; session.go), the lease keeping (a keeper: every lease's
// keepalive state and proven bound, the send schedule; keepalive.go), the
// group-commit queue (a groupcommit.Queue; batch.go) and the Acquire calls of this
// Store waiting in a queue (localQueues; wait.go). The only nesting is
// Store.mu before the keeper's lock; the keeper reports a lease it found
// dead to the session table with its own lock released.
//
// # SPI divergence: who keeps a session alive
//
// On etcd a session stays alive for as long as the Store that opened it runs
// (its keepalive stream), whether or not Heartbeat is called; Heartbeat only
// reports what the stream knows and sends nothing. On PostgreSQL only
// Heartbeat extends a session. Client silence is the server's business: it
// closes sessions whose clients stop heartbeating (docs/backends.md).
//
// # Several Stores, restarts
//
// Every Store that keeps a session's lease alive has a keeper record
// s/<id>\x00<instance> on it. An adopted session that no call used for a
// TTL is dropped (its keeper record withdrawn); ExpireSession withdraws this
// Store's keeper record and ends the session only when no other keeper record
// and no other Store's end marker exists, in the transaction that deletes the
// session record and writes this Store's end marker (record.go, expire.go). An adopting Store sends the lease's first keepalive at once,
// and a Heartbeat finding none of its own answered yet waits for that one
// (at most a third of the TTL) before it probes TimeToLive, which reports
// whole seconds, floored (session.go). When lockd restarts, the new
// process adopts a session whose client comes back before its lease ran out
// (a TTL after the old process's last keepalive), except on an Exclusive
// Store (embedded etcd), which raised the epoch and adopts no session of an
// earlier one (docs/backends.md).
//
// # Group commit
//
// Grants (TryInsert, Acquire's first transaction, a first-in-line waiter
// taking a free key) and releases (DeleteIfOwner) are each one conditional
// transaction on one lockd key. They are not sent one by one: a Store
// queues them and its committer goroutines (maxInflight of them, started
// by New and stopped by Close) send what is queued as ONE etcd Txn whose
// operations are the requests' transactions, nested under an outer Txn
// without compares; these requests are built as etcd's protobufs and sent
// on the KV client of clientv3's connection, without clientv3's copies of
// every compare (request.go). Batching is natural: a committer that is
// free sends at once whatever is queued, so on an idle Store a request goes
// out alone and immediately (there is no timer); requests arriving while
// every committer is busy form the next batch. A batch holds at most
// maxBatch requests and each lockd key at most once: every etcd key a
// request touches (grant, marker, waiters) belongs to its lockd key, so the
// nested transactions of a batch never touch the same etcd key, and a
// second request for a key waits, in arrival order, until the first one's
// batch has committed.
//
// Each nested transaction is evaluated exactly as it would be alone, and
// all its writes get the batch's revision: a grant's token is still the
// revision of its own put, strictly increasing per key. Grants of
// different keys in one batch share a token value, which C2 allows
// (tokens of different keys are not comparable).
//
// etcd fails a whole Txn when one put names a lease that no longer exists
// (a session that died), or when the Txn is too large. Then the batch is
// committed again request by request, so the dead session's caller gets
// ErrSessionDead and the others their own answers; a size refusal also
// lowers the cap. A transient failure (etcd unreachable, no leader) is every
// request's answer alike.
//
// A commit runs on the Store's context with a bounded timeout, not on a
// caller's; each caller waits for its own answer or its own ctx. A request
// whose caller gives up before it is sent is dropped. One whose caller
// gives up while it is in flight has an unknown outcome, as a cancelled
// Txn always has: a grant the request made stays in place (a retry
// returns it, already held) and is recorded as held once the answer
// arrives; a place in the queue that Acquire's request took is left then,
// unless a retry of the same session queued again meanwhile.
//
// A release (DeleteIfOwner) costs one commit when nobody waits: its
// transaction checks the owner, and in a nested transaction deletes the
// grant if the queue is empty or else reads the first waiter. Only when
// somebody waits does a second transaction hand the key to that waiter, so
// the hand-over itself is one commit; the owner check keeps a retried
// release from ever deleting a newer grant. Where the queue is likely not
// empty the first transaction is skipped: when an Acquire call of the same
// Store waits for the key and has seen itself first in line, the key is
// handed to it, and the hand-over checks that (its waiter key still there,
// no older one; if it left meanwhile, the compare fails and reads the true
// first);
// when the releasing session itself waited for the grant, a plain read
// finds the first in line. A waiting Acquire of the same Store that the
// hand-over granted is answered from the release's commit result, its watch
// event staying the net (C2 #ct2-release-handover; wait.go).
//
// # Key layout
//
// Under the configured prefix P (default "/lockd/"), one space per line
// (keys.go builds every key; TestKeyLayoutDoc checks this list against it):
//
//	P l/<key>          grant of <key>: value "<session id> <acquired-at, unix ns>",
//	                   attached to the holder's lease. Its revision, shifted
//	                   by the epoch, is the fencing token: etcd's revision is
//	                   a cluster-wide total order, never reused while the
//	                   data survives.
//	P epoch            the prefix's epoch: lockd's wall clock in µs when the
//	                   first Store opened the prefix, written once; token =
//	                   epoch + (revision − its create revision) (epoch.go,
//	                   C2 #ct2-fencing).
//	P l/<key>\x00      release marker: value "released", "revoked" or "max_hold", written
//	                   in the transaction that releases or revokes the grant
//	                   (same revision as the delete), so WatchFrom can tell
//	                   those deletes from a session ending (expired); or
//	                   "value <id> <token>", written by SetValue (a value
//	                   event). Attached to a short marker lease, so it goes
//	                   by itself (below). List skips markers.
//	P q/<key>\x00<id>  waiter of session <id> for <key>, attached to the
//	                   waiter's lease; FIFO order is the create revision.
//	                   Value "<id>", or "<id> no-deadlock-check" for a wait
//	                   never refused as a deadlock's victim (deadlock.go,
//	                   C2 #ct2-deadlock).
//	P s/<id>           session record of session <id>: JSON {lease, ttl_ms,
//	                   h: secret hash, p: principal, e: epoch}, on its lease.
//	P s/<id>\x00<inst> keeper record of Store <inst> for session <id>, on
//	                   its lease: that Store keeps the lease alive.
//	P h/<id>           holder record of session <id> (C2 #ct2-holder): JSON
//	                   {"o": owner, "l": labels}, written once at open when an
//	                   owner or labels are given, on the session's lease.
//	P v/<key>          value of <key>'s grant: "<token> <value>", written by
//	                   SetValue iff the grant is current, on the holder's
//	                   lease; shown only while its token is the grant's (holder.go).
//	P m/<key>\x00s<id> semaphore or read/write slot of session <id> (C2
//	                   #ct2-multi): "<mode> <limit> <session> <unix ns>" on
//	                   the holder's lease; its revision is the token.
//	                   m/<key>\x00w<id> is a waiter ("<mode> <limit>
//	                   <session>", and " 1" for a wait never refused as a
//	                   deadlock's victim; FIFO by create revision),
//	                   m/<key>\x00v<id> a slot's value (multi.go).
//	P d/<key>          lock-delay record of <key> (C2 #ct2-delay): "<token>
//	                   <d ms>", on a companion lease while the grant stands,
//	                   then on a lease of d; no grant while it exists (delay.go).
//	P c/<id>\x00<d ms> companion record of session <id>: the companion
//	                   lease id, on the session's lease, so an adopting Store
//	                   keeps the companion alive too (delay.go).
//	P e/<id>           end marker of session <id>: the instance name of the
//	                   Store that records the session's end (C4
//	                   #ct4-replica-count), created only if absent, on a
//	                   release-marker lease (end.go).
//
// Keys never contain NUL, so "l/<key>\x00" and "q/<key>\x00" name exactly one
// key's marker and waiters.
//
// # Release markers and residue (issue 11 §5)
//
// Every key this package writes is attached to a lease, so nothing a key
// used once leaves behind outlives the leases: grants and waiters to their
// session's, markers to a marker lease. A Store asks for a marker lease
// (TTL Options.MarkerTTL, default 20 s) when it first writes a marker,
// attaches every marker to it for half its TTL after the Grant was sent,
// then asks for a new one; it never keeps one alive. So a marker is gone
// at most 1.5 × the TTL after it was written (30 s by default, plus
// etcd's expiry check), and markers alive at any time are at most the
// releases and revokes of that window: bounded by the release rate, not
// by how many distinct keys were ever used. Session end markers (e/<id>,
// end.go) go on the same leases: one per CloseSession, per ExpireSession that
// ends a session and per lease found gone, bounded by the rate of session
// ends.
//
// Why a short-lived marker keeps WatchFrom exact: it needs the marker only
// as the PUT event in the same revision as the grant's delete, and a watch
// event carries the value it wrote. A watcher that falls behind by more
// than a marker's lifetime still receives that PUT from etcd's history,
// value included; the marker's later delete (its lease's end) is a DELETE
// of a key that is not a grant key, which WatchFrom ignores. What a watcher
// cannot survive is falling behind the compacted revision: etcd then
// cancels the watch (ErrCompacted) and WatchFrom sends EventResync and goes
// on from now, with or without markers. The marker's lifetime thus only
// bounds the residue, never what WatchFrom reports.
//
// The marker lease ending early (revoked out of band, or etcd lost it)
// fails the release transaction with "lease not found"; no other lease of
// such a transaction can be the cause, because every other lease it puts
// with is guarded by a compare on a key attached to that lease. The Store
// then asks for a new marker lease and tries again.
//
// # The held set (LocksOf) and its index
//
// A server over etcd reads a session's grants before every live heartbeat
// answer (C2 #ct2-confirm), so LocksOf must be cheap and must never be
// behind: a grant revoked through any Store before the call began must not
// be listed. A Store keeps an index of every grant and every session record
// under its prefix (one range read, then one watch of [P l/, P s0) on a watch
// stream of its own), started by the first LocksOf. Concurrent calls share
// a round: one linearizable read (a count of the epoch key), started after
// each call began; its revision R covers every write completed before. The
// round answers from the index only once the index has applied every
// change up to R (an event at R or later, or a progress notification at R
// or later, which etcd sends only to a synced watcher, after every earlier
// event), so each answer is etcd's state at a point between the call's
// start and its return. A session whose record the index does not have (or
// has on another lease) is dead. An index that cannot be shown current
// within 2 s (its watch broken, reloading, or its member behind) is not
// used: the round's calls read directly (TimeToLive with the attached keys,
// then those keys). The argument in full is in held.go.
//
// # What one call reads
//
// LocksOf: a share of one count-only read of the calls that came together,
// plus, when the index is behind that read's revision, progress requests on
// the index's watch stream (no raft round).
// Inspect reads one key and its queue. List reads at most limit grant
// keys plus the markers alive in its range (above), in pages that double
// while they hold markers (at most 4096 keys a page), plus one range of the
// listed keys' waiters. WatchFrom reads nothing: it receives the events of
// its range, marker PUTs included (one per release or revoke).
package etcdstore
