// Package parity holds lockd's backend parity suite (T-034): one set of
// scenarios driven through the gRPC API — the Go SDK (lock.dev/lockd/client)
// and, where a scenario needs to misbehave on purpose, raw lockd.v1 calls —
// against five backend rows:
//
//   - embedded: `lockd serve --backend embedded` (etcd inside lockd);
//   - etcd: an external etcd running as a process of its own
//     (test/cmd/etcd), `lockd serve --backend etcd`;
//   - pg: PostgreSQL (internal/testing/pgtest), `lockd serve --backend pg`;
//   - etcd-tls: etcd as above serving clients over TLS with client
//     certificates required, lockd with --etcd-tls-ca-file/-cert-file/-key-file;
//   - pg-tls: a PostgreSQL of its own with ssl=on, lockd with --pg-dsn-file
//     holding a sslmode=verify-full DSN.
//
// The TLS rows share their base backend's expectations (baseBackend);
// `make test` runs the base rows, `make parity` every row (LOCKD_PARITY_ROWS).
// TestParityReplicas (replicas_test.go) adds the multi-replica rows of
// issue 13: three lockd replicas over one backend — a 3-member etcd
// cluster, an external etcd, PostgreSQL — and clients given every address:
// a SIGKILL of the replica a holder and a waiter talk to, and a rolling
// restart under load.
// TestParityPython (sdkagent_test.go, issue 25) runs the scenarios that
// apply through another SDK: the Python SDK's JSON-lines agent
// (sdk/python/lockd/_agent.py, protocol in its doc string; agent_test.go
// drives it) on the embedded, etcd and pg rows, and requires the outcome
// strings the Go SDK reports; the scenarios not run through it are listed
// with why (sdkSkipped). The multi-replica scenarios run through the agents
// too (sdkagent_replicas_test.go: the agents' clients take every replica's
// address), on the etcd and pg replica rows (every replica row in `make
// parity`); a scenario of either list neither run nor listed fails the test.
// Every test but TestAgentSessionOutlivesStall (which runs first, alone) is
// parallel, and so are the row tests' rows: the rows of all of them
// (scenarios of one row in order) and TestEtcdClusterRetriesTakenPort share
// the package's -parallel, 4 unless the command line sets it (rowsAtOnce,
// TestMain; docs/reliability.md "CI time").
// lockd runs as a real child process, built once per run, so that scenarios
// can SIGKILL and restart it. Each scenario reports a short observed outcome
// per backend and declares the outcome it expects. Identical outcomes are the
// rule; a scenario may override the expectation for a backend only for an
// intended divergence listed in docs/backends.md, and says which one.
//
//	make parity    # go test -race -count=1 -run '^TestParity(Replicas)?$' -v ./test/parity/
//
// prints one row per scenario and backend: scenario | backend | outcome | ok.
// The package has no non-test code; the suite is in the _test.go files.
package parity
