// Package pgtest runs an ephemeral PostgreSQL server for tests.
//
// One server is started per test binary, lazily, the first time a test asks
// for it; every test then gets its own database:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		dsn := pgtest.NewDatabase(t) // fresh database, dropped in t.Cleanup
//		...
//	}
//
// The server is started from the local PostgreSQL binaries by package
// internal/testing/pgserver (which the chaos suite uses too): initdb and postgres
// are looked up on PATH, then in the highest-versioned
// /usr/lib/postgresql/*/bin (Debian's layout). It listens on a random
// 127.0.0.1 port, keeps its unix socket and data in a fresh temporary
// directory, runs with fsync on, and is stopped (fast shutdown) and removed
// when the test binary ends (Main). When the process runs as root the server
// runs as the unprivileged user "nobody", since PostgreSQL refuses to run as
// root.
//
// If the environment variable LOCKD_TEST_PG_DSN is set, no server is started:
// its value is the DSN of an existing server, on which the tests create and
// drop their databases (the role needs CREATEDB).
//
// NewServerWith(t, pgserver.Options{FakeTime: true}) starts a server of the
// test's own under libfaketime, whose wall clock the test steps with
// Server.SetClockOffset (the database host's clock, C2 #ct2-deadline).
//
// If no PostgreSQL binaries are found the test fails with an install hint; it
// is never skipped.
package pgtest
