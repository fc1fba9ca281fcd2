// Package history records what every process of a chaos run did to the lock
// service, and reads the records back as one merged history for the checkers
// in package check.
//
// # Operations
//
// An [Op] is one operation of one process on one key: an acquire (the reply
// carries the fencing token), a release (sent with the grant's token), a write
// to the fenced resource (sent with the token), a lost (the SDK closed the
// lock's Done channel: the process no longer trusts the lock), a crash (the
// harness killed the process; every lock it held is lost from that instant),
// or an open (the process opens a client session to acquire the key next: a
// process that cannot open one records no acquire, yet wants the key, and
// the recovery checker must see that want; [Open]).
// Each has an invoke and a complete time and an outcome:
//
//   - [OK]: the operation took effect (the acquire was granted, the release
//     deleted the grant, the write was accepted).
//   - [Fail]: it certainly did not take effect (the server answered with a
//     definite refusal: not owner, stale token, invalid argument).
//   - [Unknown]: it may or may not have taken effect (a timeout, a broken
//     connection after the request was sent, a process killed mid-call). The
//     checkers treat it as possibly applied at any instant after its invoke.
//
// A lost op's invoke time is the instant the SDK stopped trusting the lock
// (its computed deadline, when the SDK exposes it) and its complete time is
// when the process observed Done() closed. The two differ when the process
// was paused (SIGSTOP) across its deadline: the timer fires only on resume, but
// the trust had already ended at the deadline. See [Recorder.Lost].
//
// # Files
//
// Every process writes its own JSON-lines file through a [Recorder]: a start
// line, then one line when an operation is invoked and one when it completes
// (so an operation in flight when the process is SIGKILLed is still in the
// file, as invoked-but-never-completed, which [Read] turns into [Unknown]).
// Lines are written unbuffered, one write call each, so everything the process
// wrote before a SIGKILL is on disk. [ReadFiles] merges the files of a run.
//
// Every process incarnation needs its own process id (a restarted worker is
// "w3.2", not "w3" again): the checkers identify a lock holder by process id,
// and a reused id would make a new incarnation look like the holder of the old
// one's locks. ReadFiles rejects duplicate ids.
//
// # Time
//
// All times are nanoseconds since one run start shared by every process of the
// run. The harness takes the run start (the epoch) from its wall clock and
// passes it to each process it starts ([EpochEnv], [FormatEpoch]). Each process
// compares the epoch with its own wall clock once, at start ([NewClock]), and
// from then on measures with its monotonic clock: a timestamp is
// (start − epoch, by wall clock) + (monotonic time since start).
//
// This is sound on one machine because all processes read the same wall clock
// and the same kernel monotonic clock; the only error is a wall-clock step
// (NTP) between the harness taking the epoch and a process starting, which
// shifts that process's timestamps by the step. Keep the hosts' clock steady
// during runs (no ntpdate); NTP slewing changes the rate of every process's
// monotonic clock equally and so does not reorder events. Across machines this
// scheme would compare wall clocks of different machines, which lockd's safety
// argument never does: the harness is loopback-only by design.
//
// The recorder always uses the real clock. A scenario that injects a fast or
// slow clock into the SDK must not pass the SDK's (fake) times to the recorder
// unconverted: record observation times instead.
//
// A SIGSTOPped process records nothing while stopped, and monotonic time keeps
// running, so its timestamps after resume are correct; operations that spanned
// the pause simply have long intervals.
package history
