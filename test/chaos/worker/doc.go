// Package worker is the client process of the chaos suite: one lockd SDK
// client in its own OS process (test/chaos/cmd/chaos-worker), so that the
// harness can pause it (SIGSTOP) and kill it (SIGKILL).
//
// # Loop
//
// A worker opens a session and repeats: pick one of its keys at random,
// Acquire it (waiting in the FIFO queue), write to the fenced resource with
// the grant's token, hold it for a short random time, write again, Release.
// Every acquire, write and release goes into the worker's history file
// (package history) with its invoke and complete times and an outcome (ok,
// fail for a definite refusal, unknown when the effect is not known). When a
// lock's Done channel closes without a release, the worker records a lost op
// whose invoke time is the session's deadline: the instant the SDK stopped
// trusting the grant, even if the process was stopped then and only noticed
// later. A session that ended is replaced by a new one.
//
// The key of the next acquire is picked before its session is opened, and
// every session open (the first, and each after a session ended) is
// recorded as an open op naming that key (history.Open: OK when the
// session opened, unknown when the attempt failed; a failed open is retried
// for the same key). A worker that cannot open a session records no
// acquire, yet it wants the key: the recovery checker counts the open as a
// want, so a service left unable to open sessions after a fault fails it.
//
// The workers write regardless of Done: the writes model a holder that was
// paused between checking its lock and writing, which is exactly what the
// fenced resource's token check exists for. So with the check on every late
// write must be refused, and with it off (the control run) late writes show
// up as overlapping writers.
//
// # Semaphores and read/write locks
//
// Config.Limit takes every key as a semaphore slot (client.WithLimit),
// Config.RW as a read/write lock whose grants are exclusive with
// probability ExclusiveShare, else shared. The acquire and write ops carry
// the grant's mode (history.Op.Mode), and each write asks the fenced
// resource for that mode's rule (package fenced, Modes).
//
// Config.Trust = TrustIgnoreDone is the control of those scenarios: the
// worker trusts each grant until it sends the release and never records a
// lost op, like a semaphore holder that keeps using a slot lockd gave to
// another, or a reader that keeps reading past a writer's grant. Paused
// while it holds, it must show up in the trusted-overlap checker.
//
// # Talking to the harness
//
// A worker prints one line per state change on stdout, each one write:
//
//	wait KEY SESSION    an acquire of KEY was sent in session SESSION (its
//	                    id, which lockd's Inspect lists among the waiters)
//	hold KEY TOKEN P M A  KEY is granted and written once; P is 1 when the
//	                    harness may pause the worker now (every hold, at
//	                    present: the field stays for the harness); M
//	                    is the grant's mode: plain, slot, shared or
//	                    exclusive; A is the address of the lockd replica
//	                    the grant came through ("-" if unknown): with
//	                    pick-first, the one the worker talks to
//	free KEY            the release was sent (or the grant given up)
//
// The harness pauses and kills holders on these lines. SIGTERM or SIGINT
// stops the worker: it finishes the current grant (release included),
// closes its session and exits 0; any failure to record exits non-zero.
//
// # Clocks and the receive-time control
//
// Config.ClockScale runs the SDK on a clock whose rate is scaled (package
// doc of client, WithClock): 1.5 is a fast clock, 0.85 a slow one. The
// history always uses the real clock; the SDK's deadline is converted back
// to real time before it is recorded.
//
// Config.Trust = TrustReceiveTTL is a control that breaks the timing rule of
// docs/safety.md ("The timing chain", C2 #ct2-deadline) on purpose: the worker trusts each grant for a full TTL
// from the moment it RECEIVED the acquire reply and ignores Done; it records
// that belief (a lost op at receive + TTL) instead of the SDK's deadline. The
// rule is wrong whenever the reply arrives well after the server last heard
// from the session; the harness makes that happen on purpose (runner,
// UpstreamHold): it holds everything the worker sends while its grant is
// made and answered, so lockd expires the session a TTL after the last
// request it received and hands the key on while the worker still trusts
// it. The trusted-overlap checker must then report the overlap.
package worker
