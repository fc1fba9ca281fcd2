// Package pgserver runs PostgreSQL servers from the local binaries, for
// lockd's tests (through internal/testing/pgtest) and the chaos suite
// (test/chaos/runner). It is test tooling, not part of lockd.
//
// initdb and postgres are looked up on PATH, then in the highest-versioned
// /usr/lib/postgresql/*/bin (Debian's layout). Each server listens on a
// random 127.0.0.1 port with trust authentication for the superuser
// "postgres", keeps its data directory, unix socket and log (postgres.log)
// in a directory of its own, runs with fsync on, and is removed by Stop.
// When the process runs as root the servers run as the unprivileged user
// "nobody", since PostgreSQL refuses to run as root; their directories are
// then made where nobody can reach them.
//
// Start runs initdb for every server. A suite that starts many servers
// initdb's once with NewTemplate and copies the result (Template.Start).
// Options.SSL turns SSL on with a given certificate and key, for clients
// that connect with sslmode=verify-full (VerifyFullDSN; the parity suite's
// pg-tls row). Restart stops a server (fast or immediate shutdown) and starts it again
// on the same port and data, as the chaos suite's restart faults need.
//
// If the server's parent process dies without stopping it, the kernel sends
// the postmaster SIGQUIT (immediate shutdown).
package pgserver
