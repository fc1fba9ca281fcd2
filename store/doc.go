// Package store defines lockd's storage SPI: the interfaces every backend
// implements, the types that cross it and the sentinel errors it returns.
//
// The contract is docs/contracts/C2.md; comments here cite its anchors
// (#ct2-spi, #ct2-errors, #ct2-deadline). The SPI is deliberately free of
// backend vocabulary: no lease ids, no SQL types. A backend keeps those
// inside its own package.
//
// Every backend passes the conformance suite in store/storetest unchanged.
// A behaviour that only one backend has is a documented divergence
// (docs/backends.md), never a silent one.
//
// This package imports nothing beyond the standard library.
package store
