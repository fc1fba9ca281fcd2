// Package testkit holds the helpers every package's tests need: polling
// with a deadline (Eventually), contexts bound to a test (Context), log
// capture (LogBuffer), one TCP fault proxy (Proxy), a child process's
// environment (ChildEnv), a child process stopped for sure (Stop), a
// TestMain that checks for leaked goroutines (Main) and a package's own
// -parallel default (DefaultParallel).
//
// It is a leaf: it imports nothing from lockd, so the tests of any package
// (store backends, server, client, cli, chaos, parity) can use it without an
// import cycle. Wiring of lockd servers and clients lives in
// internal/testing/lockdtest, which builds on this package.
package testkit
