// Package runner runs the chaos suite's scenarios (issue 6): it builds lockd
// and the helper programs, starts real processes on loopback, injects one
// kind of fault in bounded cycles, stops everything, and runs the checkers of
// package check over what was recorded.
//
// # One scenario
//
// Run starts, in order: the fenced resource (in the harness process, token
// check on except in the fencing-off control); the backend (lockd's embedded
// etcd, a test/cmd/etcd process or three, or PostgreSQL: a database on a shared
// server, or a server of its own for the restart faults); optionally a
// toxiproxy v2.12.0 proxy between lockd and the backend; one lockd (two for
// the replica faults of issue 11, three for replica-kill and
// rolling-restart); and Options.Workers chaos-worker processes contending
// for Options.Keys fresh keys. Every process measures time against one run
// epoch (package history). After a warm-up it runs the fault cycles
// (Spec.Cycles, or Options.Duration in long mode), stops the workers with
// SIGTERM (each finishes its grant and exits), stops the servers, and
// evaluates.
//
// Faults aimed at a holder land between its two writes: the harness arms a
// trigger on the workers' state lines (package worker) and sends the signal
// from the reader of the line that fired it, within milliseconds. Before
// each SIGKILL of a worker the harness records a crash op in its own
// history file; every pause longer than the TTL is passed to the liveness
// checker as a death. A worker incarnation killed is replaced by a new one
// with a new process id.
//
// A fault that needs a window makes it (windows.go): a worker waits for
// the harness's answer to each hold line before its grant's second write,
// so the harness can keep a holder holding (a handshake), keep several
// until all hold at once (holdBarrier), or pause one and resume it only
// once the fenced resource has accepted another grant's write above its
// own — every pause of a holder lasts twice the TTL and then until then,
// so its late write certainly comes after a successor's. The receive-time
// control holds a worker's requests in a proxy (upstream.go). Each wait
// has a deadline that fails the scenario with what did not happen.
//
// # Verdicts
//
// A scenario passes when the fenced resource accepted no stale write, no
// two grants interleaved their writes, the lock history is linearizable, no
// two workers trusted one key at once, tokens increased, every waiter got a
// dead holder's key within TTL + reaper interval + slack, and after every
// fault (each cycle records its window, from the fault's start to its end)
// every key the workers wanted (an acquire of it, or a session open made to
// acquire it, in flight at the end or invoked after) was granted again
// within that bound; the workers run on after the last fault until every
// key has been granted again or the bound has passed. The scenarios that pause holders must also
// show that every pause hit a holder whose late write the fenced resource
// refused, and at least as many refused writes as pauses. A control
// (Spec.Control) passes only when its checker found the violation it was
// built to provoke; in short mode it runs cycles until the histories hold
// that violation (run.caught), at most controlMaxCycles. A control with
// Spec.BreakOff runs the same scenario and trigger without its break and
// is judged as a real scenario. The replica scenarios of issue 13 (replica-kill,
// rolling-restart) must also show no grant lost: every grant's trust ended
// by its release, since every session survives the replica it talks to. Table renders one row per scenario; Totals sums the real
// scenarios per backend family.
//
// # Semaphores and read/write locks
//
// The MultiPauseKill scenarios (multi.go, issue 15) run six workers: three
// on a semaphore of 2, three on a read/write lock, and pause or kill a
// holder of either. The fenced resource checks a slot's writes against
// lockd's holders (a client of the harness Inspects the key), a read/write
// grant's by the shared and exclusive token rules (package fenced, Modes).
// The overlap checkers are replaced by check.TooManyWriters and
// check.TooManyTrusted with the keys' kinds, linearizability (a plain lock's
// model) is not run, and the controls SemExtra and IgnoreDone must each be
// caught on the keys they break.
//
// # Membership changes
//
// MemberReplace (members.go, issue 21 §2) replaces the members of the
// three-member etcd cluster one per cycle, oldest first: MemberRemove, the
// removed member's own exit, MemberAdd of a member with new ports and an
// empty data directory started with --initial-cluster-state existing. After
// three cycles none of the members lockd was started with remains, so lockd
// serves on only if its etcd client follows the member list
// (--etcd-auto-sync-interval, 1 s here); the control NoSync starts lockd
// with it off and must fail recovery. A new member never gets an address an
// earlier member had, and a removed member's client port stays bound by the
// harness, so a lockd that does not follow reaches no etcd at all. A lockd
// that reaches etcd through the toxiproxy proxy has the sync off: the member
// list would take it around the proxy.
//
// # Processes
//
// Every child gets Pdeathsig SIGKILL, so a harness that dies takes its
// children along, and none of the harness's LOCKD_* environment (lockd
// refuses unknown LOCKD_ variables). PostgreSQL runs as "nobody" when the
// harness runs as root. Logs go to the scenario's directory. A lockd that a
// fault kills or stops is restarted on the same address; meanwhile the
// harness holds that address (a socket bound to it, not listening), so that
// no other socket on the machine takes the port.
package runner
