// Package lockdv1 is the generated Go code of lockd's gRPC API,
// proto/lockd/v1/lockd.proto (package lockd.v1). Regenerate it with
// `make generate`; `make check-generate` fails when the committed code is
// stale. Programs use the SDK in lock.dev/lockd/client rather than these
// stubs; the server is lock.dev/lockd/server.
package lockdv1
