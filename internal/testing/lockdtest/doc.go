// Package lockdtest runs a real lockd server in the test process: the
// server package over a real store (embedded etcd or PostgreSQL, or any
// store a test hands in) listening on 127.0.0.1:0, plus a connected SDK
// client, all cleaned up with t.Cleanup.
//
// A package using it calls Main from TestMain, which stops the shared
// embedded etcd and PostgreSQL servers after the tests and checks for
// leaked goroutines:
//
//	func TestMain(m *testing.M) { lockdtest.Main(m) }
//
//	func TestX(t *testing.T) {
//		for _, backend := range lockdtest.Backends {
//			t.Run(backend, func(t *testing.T) {
//				srv := lockdtest.StartBackend(t, backend, lockdtest.Options{})
//				s, err := srv.Client.NewSession(ctx)
//				...
//			})
//		}
//	}
//
// Stores are opened with backend.Open, as `lockd serve` opens them: an
// external-etcd configuration with the shared embedded etcd's endpoints and
// a key prefix per test, or a PostgreSQL configuration with a database per
// test.
//
// Also here: NewNamespace/StartOn for several lockd replicas on one
// backend namespace, Faulty (a store wrapper that injects errors and fixes
// Remaining), Logs (captured log records), and ExampleAddr (a shared server
// for runnable Example functions). Polling, fault proxies and log buffers
// are in internal/testing/testkit.
package lockdtest
