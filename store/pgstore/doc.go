// Package pgstore is lockd's PostgreSQL backend: a store.LockStore on pgx v5
// and pgxpool. It is the behavioural reference every other backend matches.
//
// # Schema
//
// New applies the embedded, versioned migrations (migrations/*.sql) in one
// transaction holding a transaction-scoped advisory lock keyed by the schema
// name, so replicas starting together never race. Everything lives in one
// schema (Options.Schema, default "lockd"):
//
//   - sessions: one row per session, with its TTL and expires_at;
//   - locks: one row per held key, referencing its session ON DELETE
//     CASCADE (index lock_entry_session_idx), with the fencing token;
//   - waiters: the FIFO queue of each key (a bigserial id gives the order),
//     also referencing the session ON DELETE CASCADE;
//   - fencing_token: the sequence tokens come from. No cascade touches it
//     and it is never reset, so tokens are never reused; it is raised to
//     the wall clock in µs at open and on each new connection, so a new
//     schema or a promoted replica starts above older tokens (epoch.go,
//     C2 #ct2-fencing).
//
// Builds of lockd on either side of migration 0002 must not share a schema:
// they send different notifications (docs/backends.md, upgrade note).
//
// # Time
//
// Expiry uses the database clock only: expires_at is set from now() inside
// the statement that opens or heartbeats a session, and a session whose
// expires_at is not in the future is dead for every operation, whether or
// not the reaper has deleted its row yet; it is never extended again. The
// reaper (one goroutine per Store, every Options.ReaperInterval) deletes
// sessions with expires_at < now(); the cascade removes their locks and
// queue entries. Several replicas reaping at once is safe: each claims rows
// with FOR UPDATE SKIP LOCKED.
//
// Remaining (C2 #ct2-deadline): Heartbeat and OpenSession report the
// session's full TTL, since expires_at = now() + TTL and the database's now()
// is later than the moment lockd received the call (for a batched heartbeat,
// later than the receipt of every heartbeat in the batch). Grants report
// expires_at - now(), computed in SQL; they do not extend the session.
//
// # Group commit
//
// Concurrent grant attempts (TryInsert, each attempt of Acquire) and
// releases (DeleteIfOwner) of one Store share one transaction, sent as one
// pipelined batch of set-wise statements: one round trip, one commit
// (groupcommit.go). A request goes out at once when a worker is free (there
// is no linger); requests that arrive while every worker's batch is in
// flight form the next batch. A key is in at most one batch in flight, and
// requests for one key go out in arrival order. Each request gets its own
// outcome, computed inside the statements (a dead session, a busy key or a
// stale token fails only its own request); if the transaction fails as a
// whole, each of its requests runs again alone. Every grant, batched or
// not, draws its token in the INSERT while it holds the key's advisory lock
// (keyLock), as grant explains. A release takes its key's lock too: in
// its commit it hands the key to the first live queued session (handOver,
// C2 #ct2-release-handover), and a waiting Acquire of this Store that it
// granted is told from the commit's result (tellHandOver), with no attempt
// of its own; a waiter elsewhere learns from the released event, whose
// attempt finds the key held. Concurrent heartbeats likewise share one UPDATE,
// and concurrent LocksOf reads one SELECT that starts after each was
// called (a server reads the held set after every heartbeat). A request
// whose caller gives up before it is sent is dropped; once sent, its caller
// returns at once and the worker undoes a queue entry the batch made for it
// (a grant is kept, as on etcd: a retry through any instance returns it;
// see undo). The batch size is
// lockd_backend_batch_size. Every lock transaction runs with generic plans
// (keyLock sets plan_cache_mode for that transaction only): its statements
// are planned once per connection, not on every execution (issue 24).
//
// # Waiting and watching
//
// Statement-level triggers on locks NOTIFY a channel private to the schema
// when locks are granted, released, revoked or expire (several events per
// notification, not one per row), and a row trigger on waiters
// when a waiter leaves a queue. CloseSession and the reaper, which read the deleted locks
// anyway, silence the lock trigger (lockd.notified) and send those expired
// events themselves, more compactly. Each Store holds one dedicated
// listening connection and dispatches those notifications to its waiting
// Acquire calls (by key: only the key's first waiter when the event names
// it, see wakeLocked; for a semaphore or read/write key, changed under the
// key's lock, only the waiters its holders now admit, migration 0008; a
// slot's release has granted those already, migration 0010) and
// to its watches (by prefix); NOTIFY delivers in
// commit order, so watches see events in commit order. There is no polling
// on the hot path. As a safety net against a lost notification, a waiting
// Acquire re-checks its queue every few seconds (recheckInterval), and every
// waiter re-checks when the listening connection is re-established after a
// loss.
//
// A lock row's delete reports the reason its transaction set in the
// transaction-local setting lockd.reason ("released", "revoked"); without
// one it is reported as store.EventExpired, which therefore means "the
// holder's session ended": expiry, reaping, CloseSession.
//
// # Sessions across instances
//
// Session rows live in the database, so every Store on the same schema sees
// every session and a session survives the lockd that opened it (until it
// expires). This differs from etcd, where a session dies with its keepalive
// (docs/backends.md, restart semantics). Close does not close sessions.
//
// # Telemetry
//
// C4 events and metrics are emitted by the instance that caused them: the
// one that opened, closed or reaped a session, granted, released or revoked
// a lock. The gauges (sessions_active, locks_held) are therefore exact only
// summed over all replicas sharing a schema.
package pgstore
