// Package sdk runs the SDKs in other languages against real lockd servers
// (in process, over the shared embedded etcd and PostgreSQL of
// internal/testing/lockdtest, also over TLS/mTLS, with bearer tokens and as replicas
// of one backend; docs/contracts/C2.md #ct2-sdk).
//
// TestPythonSDK runs sdk/python's unittest suite against them with Debian's
// /usr/bin/python3 (python3-grpcio, python3-protobuf). The servers'
// addresses and files reach the Python tests as PYSDK_* environment
// variables; a small HTTP endpoint on loopback (PYSDK_CONTROL) lets them
// stop or kill a replica (3 per backend for the sync failover test, 2 more,
// PYSDK_AIO_REPLICAS_*, for lockd.aio's). `make python-sdk` runs it alone.
//
// TestTypeScriptSDK installs sdk/typescript's locked npm dependencies (npm
// ci, whose prepare script is the one tsc build) and runs its node:test
// suites: the timing rules under a fake clock, and the integration tests
// against each backend (LOCKDTEST_* variables; its own loopback control
// endpoint stops or kills replicas and pauses proxies), and checks the
// package as an application gets it (tspackaging_test.go: npm pack, npm
// install of the tarball into a new project offline, node's import and tsc
// on its declarations). `make typescript-sdk` runs it alone.
//
// `make test` runs both with everything else. The two run in parallel, and
// so do TestTypeScriptSDK's per-backend integration runs (after its unit,
// bench-rows and security runs): each has servers, replicas, proxies and
// control endpoints of its own, and they mostly wait (the package used
// about a quarter of a core run one after the other: 53 s of CPU in 199 s;
// issue 21, docs/reliability.md "CI time").
package sdk
