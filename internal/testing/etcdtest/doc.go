// Package etcdtest gives tests a real etcd: one embedded single-node server
// per test binary (temp dir, loopback, short ticks so leases of one second
// are allowed), clients connected to it, a unique key prefix per test, a
// TCP proxy that can cut or pause connectivity for outage tests, and a
// client that loses one transaction's reply after etcd applied it
// (NewDropClient) for unknown-outcome tests.
//
// A package using it stops the server in TestMain:
//
//	func TestMain(m *testing.M) { etcdtest.Main(m) }
//
// Main also checks for leaked goroutines (goleak) after the server stopped.
package etcdtest
