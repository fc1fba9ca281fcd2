// Package soak is the storage soak of issue 11 §5: full load on many
// distinct keys against a backend with a small quota, asserting that what
// the backend stores and what lockd holds stay flat.
//
// TestSoak runs, per backend (embedded etcd with a 64 MiB quota, and
// PostgreSQL), 64 sessions that each grant and release a key never used
// before, as fast as the backend answers, for LOCKD_SOAK_DURATION (default:
// a smoke run of a few seconds per backend, part of `make test`; `make soak
// DURATION=30m` runs the long one). Every sample interval it records the
// backend's key count (etcd keys; PostgreSQL rows of lockd's tables), the
// database's size in use (etcd DbSizeInUse; PostgreSQL the size of lockd's
// tables), the process's RSS and its goroutines — lockd's store and, for
// etcd, the embedded server run in this process. Flat checks db size in
// use, RSS and goroutines: a series' maximum over the last third of the run
// may exceed its maximum over the middle third by at most a tolerance. The
// key count is checked against what the design allows at each sample (one
// key per grant in flight and per session, plus one marker per pair
// released within the marker lifetime before it), because markers alive
// follow the release rate, which moves with the machine's load. No request may fail for space (etcd's
// NOSPACE), and at most 1 % may fail at all.
//
// TestSoakControl runs the etcd smoke with release markers left without a
// lease (the behaviour before issue 11): the key count grows with every
// released key, and the key-count check must say so — otherwise it is
// blind.
//
// LOCKD_SOAK_DURATION (Go duration, per backend), LOCKD_SOAK_BACKENDS
// (comma list of etcd, pg; default both) and LOCKD_SOAK_REPORT (a file the
// per-sample table is appended to) configure a run.
package soak
