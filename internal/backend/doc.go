// Package backend is lockd's composition root for storage: it turns the
// backend part of the C5 configuration (Config: lock.backend, lock.etcd.*,
// lock.pg.*, lock.embedded.*) into a running store and closes it again.
// `lockd serve`, the test harness (internal/testing/lockdtest) and `lockd bench` all
// open their backend here, so opening a backend is written once.
//
//	b, err := backend.Open(ctx, cfg, logger, metrics)
//	...
//	srv, err := server.New(serverCfg, b, server.Options{BackendLabel: b.Label(), ...})
//	...
//	err = b.Close()
//
// # What Open builds
//
//	embedded  an etcd server in this process (data in lock.embedded.data-dir,
//	          quota lock.embedded.quota-bytes, compacted by revision count as
//	          lock.embedded.compaction-retain-revisions says, NOSPACE recovered
//	          by itself), a clientv3 client to it, and an etcdstore over it
//	etcd      a clientv3 client to lock.etcd.endpoints and an etcdstore
//	pg        a pgstore, which opens its own pgx pool from lock.pg.dsn
//
// An external etcd (lock.backend=etcd) is never compacted, defragmented or
// disarmed by lockd: it belongs to its operator (C5 #ct5-storage).
//
// Every etcd store writes its keys under lock.etcd.prefix. The etcd client
// uses etcdstore.ClientConfig with lock.etcd.dial-timeout, and
// etcdstore.New is bounded by that timeout too.
//
// # Shutdown order
//
// Close closes, in this order and each only after the one before has
// returned: the store (which stops its keepalives, watches and reaper, and
// closes the pool it opened), then the etcd client, then the embedded etcd
// server. Each part is still needed by the one closed before it. Close is
// idempotent. When Open fails it closes what it had started, in the same
// order.
//
// # Telemetry
//
// The C4 backend label is Config.Label: "etcd" for the embedded and the
// external etcd, "pg" for PostgreSQL. The metrics handed to Open must carry
// that label (telemetry.NewMetrics(reg, cfg.Label())); a server sharing them
// gets the same label (server.Options.BackendLabel).
//
// The embedded server's logs go to the logger at warn level and above, with
// component=etcd. Its goroutines carry the pprof label ProfileLabel =
// ProfileEmbedded, so a CPU profile of the process tells etcd's CPU from
// lockd's. etcd registers its own metrics on the Prometheus global registry;
// lockd's registry never sees them.
package backend
