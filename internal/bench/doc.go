// Package bench is the engine of `lockd bench`: it measures lockd (its gRPC
// server on 127.0.0.1, driven through the Go SDK, over a real backend) side by side with the locking a user would build directly on
// that backend instead, on the same backend instance, and reports the
// figures and the ratio lockd / raw for each scenario.
//
// # Systems
//
//	lockd       the lock service: server.Server over etcdstore or pgstore,
//	            clients through lock.dev/lockd/client, one session per client
//	etcd-txn    raw etcd: Txn(If CreateRevision(key) == 0 Then Put(key) with
//	            the client's lease) to acquire, Delete to release; a client
//	            that finds the key taken watches it for its delete and retries;
//	            session death is a lease revoke
//	etcd-mutex  go.etcd.io/etcd/client/v3/concurrency.Mutex, one
//	            concurrency.Session per client
//	etcd-election  go.etcd.io/etcd/client/v3/concurrency.Election
//	            (Campaign, Resign, Observe), one concurrency.Session per
//	            candidate: the election scenario's primary etcd baseline
//	pg-raw      raw PostgreSQL: INSERT … ON CONFLICT (key) DO NOTHING
//	            RETURNING a sequence token, DELETE … WHERE key AND token; a
//	            client that finds the key taken polls (every 2–10 ms); session
//	            death is ON DELETE CASCADE from a sessions row
//	etcd-sem    the semaphore scenario's raw etcd baseline (etcd's
//	            concurrency package has no semaphore): the N-slot recipe, a
//	            waiter key per client on its lease, holding a slot while
//	            fewer than N keys have a lower create revision, else watching
//	            for deletes of those
//	pg-sem      the semaphore scenario's raw PostgreSQL baseline: N slot rows
//	            per semaphore, one taken with UPDATE … WHERE (sem, slot) =
//	            (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1), polled every 2–10 ms
//	            while none is free; session death frees slots (ON DELETE SET
//	            NULL)
//
// lockd over etcd (embedded or external) is compared with etcd-txn and
// etcd-mutex, lockd over PostgreSQL with pg-raw. The election scenario
// compares lockd with etcd-election and etcd-txn (its lock with the value,
// observed by Get + watch), or with pg-raw (its lock on a leaders table
// with the value, observed by polling the row): PostgreSQL has no election
// library to compare with.
//
// # Scenarios
//
//   - distinct: each client acquires and releases keys nobody else uses, at
//     several concurrencies: pairs (acquire + release) per second and the
//     p50/p99 latency of one pair.
//   - contended: every client loops acquire/release on one key: hand-overs
//     per second and fairness (max/min acquisitions per client).
//   - election: c candidates (2 and 8) campaign in a loop for one
//     election, each leader resigning as soon as every other candidate
//     campaigns, while one observer follows it: hand-overs per second,
//     hand-over latency (Resign start until the next leader's Campaign
//     returned) and observed latency (until the observer reported the next
//     leader), p50/p99, and the share of leaders the observer reported. A
//     second leader before the first resigned fails the measurement.
//   - semaphore: c clients (8 and 64) loop taking one of the N slots (4) of
//     one counting semaphore, holding it 1 ms and freeing it: acquisitions
//     per second, the wait for a slot (p50/p99), fairness and the most
//     holders at once; more than N at once fails the measurement.
//   - acquire-all: c clients (1 and 8), each with keys of its own, loop
//     taking a set of 4 keys and releasing them, on lockd both ways:
//     lockd-all (Session.AcquireAll, one commit for a set of free keys)
//     against lockd-sorted (Session.Acquire of each key in ascending order):
//     sets per second and the take's p50/p99 (acquireall.go).
//   - death: one session holds N locks and ends (lockd: the client closes
//     it; raw: lease revoke / delete of the sessions row): the time from the
//     end until the backend holds none of the keys.
//   - idle: N lockd sessions held open for a while: CPU (% of one core,
//     from the child's per-thread /proc schedstat times) and RSS (VmRSS,
//     and the peak VmHWM) of the lockd process. That process is a `lockd
//     serve` child (Config.LockdCommand), so the SDK clients holding the
//     sessions, which run in this process, are not counted. With the
//     embedded backend the child runs its own embedded etcd, as the
//     zero-configuration deployment does, and that is counted.
//   - estimate (only when named, Optional; issue 27): the first contended
//     concurrency's clients loop on one key, holding it 10–50 ms, each
//     polling Inspect while it waits: |estimate − actual| p50/p90, from the
//     first answer that lists the waiter to its grant (estimate.go).
//
// # Processes
//
// Over --backend etcd and pg every measured system runs in processes of its
// own (cells.go): lockd's server is a `lockd serve` child for the run, and
// each cell (system, scenario, concurrency, round) of distinct, contended,
// election and semaphore runs its clients in a `lockd bench worker` child
// (worker.go), lockd's SDK clients as much as a baseline's. The worker
// reads the CPU time of itself, of lockd's server and of the etcd child at
// the opening and closing of the load's window (cpu.go): the CPU per
// operation rows. Config.InProcess (the embedded etcd, a CPU profile) runs
// everything in this process, as before issue 24, without those rows. Every
// cell checks that the backend committed something while the system counted
// operations (checkWork).
//
// # Alternation
//
// Each measurement (one system, one scenario, one concurrency) lasts
// Config.Duration after a short warm-up on fresh sessions (a fifth of the
// duration, at most a second; for the contended key the window opens at the
// first grant after the warm-up, so the clients have queued up, and lasts at
// least the duration from the CPU clocks' first reading). A scenario runs
// Config.Rounds rounds and each round measures every system in turn (lockd,
// then the baselines), so slow drift of a shared machine hits every system
// alike. Rates, fairness and death times are the median over rounds;
// latency percentiles are taken over the pairs of all rounds together.
package bench
