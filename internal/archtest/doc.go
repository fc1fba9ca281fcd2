// Package archtest holds tests about the shape of the whole module rather
// than about one package: today, that no etcd lease vocabulary leaks out of
// store/etcdstore (the Go form of the seed's grep for leaseId and
// LeaseGrantResponse, C2 #ct2-spi).
package archtest
