// Package embedetcd runs a single-node etcd server inside the lockd process:
// the default backend (lock.backend=embedded) and the server behind the
// tests (internal/testing/etcdtest).
//
// The server listens on loopback only. With Config.Socket (lockd's embedded
// backend) its clients connect through a unix socket in the data dir, which
// is made mode 0700, and its raft peer listener is a unix socket there too
// (no TCP port at all), so no other local user can reach either
// (docs/backends.md, "Transport security"). Its zap logs go to the injected
// *slog.Logger at warn level and above (nil: discarded). etcd registers its
// own metrics on the prometheus global registry when its packages load; lockd
// keeps its metrics on a registry of its own, so the two never mix — never
// hand lockd's registry to anything in this package.
//
// The data directory survives Close: starting again on the same directory
// keeps the store's revision, so fencing tokens (etcd revisions) keep rising
// across restarts.
//
// Storage upkeep (C5 #ct5-storage): besides etcd's own hourly compaction, a
// goroutine of the Server (started by Start, stopped by Close before the
// server) compacts the history every Config.CompactionInterval to the
// current revision minus Config.CompactionRetainRevisions, and, when etcd
// raises its NOSPACE alarm (Config.QuotaBytes exceeded), compacts to the
// current revision, defragments and disarms the alarm. It logs the C4
// events backend_compacted, backend_space_exhausted and
// backend_space_recovered to Config.Logger.
package embedetcd
