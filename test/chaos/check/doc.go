// Package check holds the checkers of the chaos suite (issue 6). Each takes
// what a run recorded, a history (package history) or the fenced resource's
// accepted writes (package fenced), and returns a Result: a violation count,
// human-readable details, and notes. Every checker is tested on a history it
// must pass and on one it must fail: a checker that cannot fail is worthless.
//
// # What each checker proves
//
// FencedSafety: the fenced resource never accepted a write with a token lower
// than one it had already accepted for the key, and never accepted one token
// from two writers. This is lockd's end-to-end promise: whatever a paused or
// partitioned holder does, the resource refuses it once a newer holder has
// written. It is computed from the resource's own log, independently of the
// resource's check, so a broken check (">" for ">=", a per-server rather than
// per-key maximum) is caught too.
//
// OverlappingWriters: the control. With the resource's token check off,
// a resumed paused holder's writes interleave with its successor's (A, B, A
// on one key). The control run must find some; if it finds none, the pause
// scenario did not exercise the property and FencedSafety's zero proves
// nothing.
//
// Linearizable: the lock operations of every key are linearizable (checked
// with porcupine) with respect to a sequential lock: the state is the holder
// and its token; acquire(p) → t is legal only when the key is free and t is
// higher than every token granted before (so tokens strictly increase in
// linearization order); release(p, t) succeeds only if p holds t. A lost
// (p's SDK stopped trusting) or crash (p was killed) frees p's grant at some
// instant after the end of trust, because the backend frees it no earlier
// (docs/safety.md, "Why the chain holds"). So a grant to q that completed
// before p stopped trusting is not linearizable. Ambiguous (Unknown) acquires
// and releases are possibly applied: the model is nondeterministic
// (porcupine's NondeterministicModel) and may apply them or not, at any
// instant after their invoke. Definite failures and writes are left out.
//
// NoTrustedOverlap: per key, the intervals in which different processes
// trusted a grant, [acquire reply received, release sent / SDK deadline /
// kill], never overlap (TrustIntervals). This is the timing argument of
// docs/safety.md made observable ("How the tests show it"); it is the property
// that fails when the server grants a full TTL on every heartbeat or the SDK
// measures its deadline from receive time.
//
// TooManyTrusted and TooManyWriters: NoTrustedOverlap and OverlappingWriters
// for semaphores and read/write locks (C2 #ct2-multi), given each key's Kind:
// at no instant more than N trusted holders of a semaphore of N, or more than
// N grants acting at the fenced resource (between their first and last
// accepted write); never an exclusive grant trusted or acting together with
// any other grant of a read/write lock. FencedSafety follows the resource's
// modes: a shared write is stale below an earlier exclusive token, an
// exclusive one below any earlier token, and a semaphore slot's writes are
// left to TooManyWriters.
//
// TokensIncrease: per key, no token was granted to two processes, and a grant
// that certainly happened after another (its acquire was invoked after the
// other's completed) carries a higher token — across restarts and failovers.
//
// Liveness: after a holder dies (HandOvers derives what happened to its keys
// from deaths the runner supplies and the history's crash ops), the next
// waiter is granted the key within a bound (LivenessBound: TTL + reaper
// interval + slack). It reports p50/p99/max of the hand-over delays and counts
// the hand-overs over the bound, including waiters that gave up past it.
//
// Recovery: after every fault ends (the runner supplies the windows), each
// key some process wanted was granted again within the same bound
// (Regrants). A process wants a key while its acquire of it is in flight,
// and while it opens a session to acquire it next (history.Open), so a
// service left unable to open sessions after a fault fails it too, although
// its workers then record no acquire at all. Liveness alone sees only keys
// whose holder died; a fault that leaves the service unable to grant
// anything passes it, and every safety checker, with one acquisition in the
// whole run. A fault's window ends where the next fault begins: a key still
// wanted then is judged against the next fault (measured from its end),
// unless the bound had already run out.
//
// PausesHitHolders: every pause (SIGSTOP) the runner injected hit a process
// holding a key, and a write of that grant after the pause was refused by
// the fenced resource: the pause really tested fencing. A pause that raced
// the holder's second write (the write went out before the stop took
// effect: a write invoked inside the pause) is reported as such; the runner
// makes it impossible (the worker waits for the runner's answer to its hold
// line, given after the stop).
//
// # Recording requirements
//
// The checkers are only as good as the history. Workers must record every
// acquire, release and write with Recorder.Invoke/Complete (Unknown for any
// error after which the effect is not known), every session open as an Open
// of the key they ask for once it is open (only Recovery reads it; the
// others ignore it), record Lost when Done() closes
// without a release, using the SDK's deadline when it has one, and release or
// record lost before the run stops (an interval never ended runs forever).
// The harness records a Crash for every SIGKILL and passes pause and kill
// times as deaths to HandOvers. Keys must be fresh per run: every checker
// assumes a key starts free with no token granted.
package check
