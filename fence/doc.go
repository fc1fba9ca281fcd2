// Package fence is the resource side of fencing (C2 #ct2-fence-kit): the
// rule a resource applies to the fencing token a lockd holder sends with
// each write, and the pluggable store of its high-water marks.
//
// lockd hands out a fencing token with every grant, strictly increasing per
// key (C2 #ct2-fencing). A holder that was paused past its lease, or whose
// lock was revoked, may still send a write after a newer holder did; the
// token lets the resource refuse it. The rule: per key, keep the highest
// token accepted (the high-water mark); accept a write whose token is at or
// above it (and raise the mark), refuse one below it (ErrStale) and change
// nothing.
//
// The pieces, one per kind of resource:
//
//   - fence/fencepg: PostgreSQL — a SQL file users apply (the lockd_fence
//     table, lockd_fence_check and a trigger function raising SQLSTATE
//     LF409) and a helper for pgx v5 transactions; fencepg.Store keeps
//     marks for other pieces;
//   - fence/fencehttp: net/http middleware (headers Lockd-Fence-Key and
//     Lockd-Fence-Token, 409 on a stale token), marks in a Store;
//   - fence/fencefile: local files written under a lock with the mark
//     beside them; the recipe for object stores is in the README.
//
// Nothing here imports lockd's server, store or SDK: a resource needs only
// the key and token its clients send.
package fence
