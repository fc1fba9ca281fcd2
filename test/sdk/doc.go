// Package sdk runs the SDKs in other languages against real lockd servers:
// TestPythonSDK starts lockd (in process, over the shared embedded etcd and
// PostgreSQL of internal/lockdtest, also over TLS/mTLS, with bearer tokens
// and as replicas of one backend) and runs sdk/python's unittest suite
// against them with Debian's /usr/bin/python3 (python3-grpcio,
// python3-protobuf). The servers' addresses and files reach the Python tests
// as PYSDK_* environment variables; a small HTTP endpoint on loopback
// (PYSDK_CONTROL) lets them stop or kill a replica (docs/contracts/C2.md
// #ct2-sdk). `make python-sdk` runs it alone; `make test` runs it with
// everything else.
package sdk
