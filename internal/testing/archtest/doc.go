// Package archtest holds tests about the shape of the whole module rather
// than about one package: that no etcd lease vocabulary leaks out of
// store/etcdstore (the Go form of the seed's grep for leaseId and
// LeaseGrantResponse, C2 #ct2-spi), that the SDK's import graph
// (`go list -deps ./client`) holds no Prometheus, etcd, pgx, server, store,
// backend or internal package, and that no non-test file of the SDK is
// longer than 500 lines.
package archtest
