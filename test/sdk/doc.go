// Package sdk runs the SDKs in other languages against real lockd servers
// (in process, over the shared embedded etcd and PostgreSQL of
// internal/lockdtest, also over TLS/mTLS, with bearer tokens and as replicas
// of one backend). TestTypeScriptSDK installs sdk/typescript's locked npm
// dependencies, compiles it once with tsc and runs its node:test suites: the
// timing rules under a fake clock, and the integration tests against each
// backend. `make typescript-sdk` runs it alone; `make test` runs it with
// everything else.
package sdk
