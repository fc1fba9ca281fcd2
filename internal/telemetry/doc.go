// Package telemetry holds lockd's C4 log events and metrics
// (docs/contracts/C4.md) in one place, so every backend and the server emit
// the same names with the same fields and labels.
//
// Loggers are injected and discard by default; metrics register on an
// injected prometheus.Registerer, never the global one. Labels come only from
// the fixed enums below (C4 #ct4-cardinality): never a key, a session id or a
// client identity.
package telemetry
