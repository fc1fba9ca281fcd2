// Package tlsreload holds TLS material (certificates, keys, CA bundles)
// loaded from files and re-reads it when the files change on disk or when
// asked to (SIGHUP), with the C4 events tls_reloaded and tls_reload_failed.
// It is the one reloader of lockd's listeners (server) and of its etcd
// client (internal/backend, lock.etcd.tls.*): C5 #ct5-tls.
package tlsreload
