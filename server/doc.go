// Package server is lockd's gRPC server: the lockd.v1.LockService API
// (proto/lockd/v1) over one store.LockStore, plus the standard gRPC health
// service, server reflection (so grpcurl works), and an HTTP handler for
// /metrics and /healthz.
//
//	srv, err := server.New(cfg, st, server.Options{Logger: log})
//	go srv.Serve(lis)
//	...
//	err = srv.Shutdown(ctx)
//	st.Close()
//
// # Client liveness
//
// The server owns client liveness. A session whose client sends no
// KeepAlive request is closed by the server (C4 session_lost, reason
// client_silent), releasing its locks so that waiters get them. Following
// docs/safety.md ("What the server may and may not do"), the server never
// closes a session before the Remaining it last granted has run out counted
// from when it received the request the grant answered: it closes after
// max(TTL, last granted Remaining) of silence. One goroutine with a timer heap
// does this for all sessions. Together with the backend's own expiry (lockd
// itself dies: etcd leases and PostgreSQL rows expire after the TTL), every
// way a holder can die releases its locks.
//
// KeepAlive answers pass the store's Remaining through unchanged: the store
// measures it from its own receipt of the heartbeat, which is later than the
// client's send, so the client's deadline (send + Remaining − safety margin)
// stays inside the backend lifetime. A transient backend error is answered
// with a per-session retryable error, and the client keeps its deadline.
//
// When a lock held by a session of this server is revoked or expires, the
// holder is told on its KeepAlive stream (a LockLost notice). The server
// keeps one backend watch of all keys for this and routes events by session,
// key and token; after the watch is interrupted it reconciles its grants
// against the backend. An admin revoke deliberately breaks the holder's
// trust (as in etcd and Consul): the notice tells the holder to stop, and
// the fencing token protects the resource in the meantime.
//
// # Replicas
//
// Several lockd servers may share one backend (C2 #ct2-replicas), and a
// client may send any request of a session to any of them: a server that
// gets a call for a session it does not know adopts it from the store (etcd:
// from the session record on the session's lease, which it then keeps alive
// too; PostgreSQL: the session is a row). A server whose client fell silent
// ends the session only through the store's ExpireSession, which ends
// nothing the backend still keeps alive, so a client that moved to another
// server keeps its session and locks. A server told to stop drains (C2
// #ct2-drain): it tells its clients to move and ends no session. Each server
// watches the backend, so a lock-loss notice is pushed by whichever server
// the holder's stream is attached to. The argument: docs/safety.md,
// "Replicas over one backend".
//
// # Errors
//
// Errors cross the wire in one place, errors.go, in the vocabulary of
// lock.dev/lockd/proto/lockd/v1/wireerr. Each carries a google.rpc.ErrorInfo
// with domain wireerr.Domain and a wireerr.Reason* value:
//
//	invalid input            InvalidArgument     INVALID_ARGUMENT (a BadRequest names the field)
//	dead or unknown session  FailedPrecondition  SESSION_DEAD
//	not the current grant    PermissionDenied    NOT_OWNER
//	contention               Unavailable         CONTENTION
//	backend not leader       Unavailable         NOT_LEADER
//	backend unreachable      Unavailable         UNAVAILABLE
//	server shutting down     Unavailable         SHUTTING_DOWN
//	Acquire wait timeout     DeadlineExceeded    WAIT_TIMEOUT
//	a server limit           ResourceExhausted   LIMIT
//	the caller's ctx ended   Canceled / DeadlineExceeded (no reason)
//	anything else            Internal            INTERNAL (generic message; logged)
//
// # Limits
//
//   - A request message is at most MaxRecvMsgSize (64 KiB); a larger one (up
//     to 256 KiB read) is INVALID_ARGUMENT naming the request (C2
//     #ct2-bad-input), as is invalid UTF-8, naming its field (badinput.go).
//   - Keys follow store.ValidateKey (UTF-8, 1..512 bytes, no NUL); session
//     TTLs store.ValidateTTL (2s..1h) and must exceed twice the safety
//     margin; List pages hold at most store.MaxListLimit keys.
//   - One Acquire waits at most MaxWait (10 minutes).
//   - One KeepAlive stream carries at most MaxSessionsPerStream sessions and
//     answers at most MaxInflightPerStream heartbeats at once; a client that
//     stops reading its replies has its stream ended.
//   - At most 1024 lock-loss notices wait for a session that has no
//     KeepAlive stream attached; older ones are dropped.
//   - Config bounds what clients can make the server hold (limits.go, C2
//     #ct2-limits, C5 #ct5-limits): sessions kept and OpenSession calls in
//     progress, connections, KeepAlive and Watch streams, watches, waiting
//     acquires in all and per key, keys per session, and the longest session
//     TTL. A request beyond one is refused before anything is written, with
//     ResourceExhausted, reason LIMIT and the bound's name in the ErrorInfo
//     metadata, and counted in lockd_limit_rejections_total{limit}. Heartbeats
//     are never refused: new sessions are turned away (not queued) before the
//     keepalives of existing ones are delayed.
//
// # Shutdown
//
// Shutdown stops accepting connections, ends waiting acquires and streams
// (clients see Unavailable SHUTTING_DOWN and retry elsewhere), waits for
// in-flight RPCs and stops every goroutine of the server. By default it does
// NOT close sessions: they are left to expire. A restart of lockd must not
// release locks that clients still trust — their trust runs until their
// local deadline, and the backend keeps their locks at least that long. On
// PostgreSQL and an external etcd the sessions survive the restart and the
// clients carry on with the new process or another replica, which adopts
// them (C2 #ct2-replicas); on the embedded etcd the leases expire after
// their TTL once the store stops keeping them alive, by which time every
// client has stopped trusting. Before it stops, Shutdown drains (drain.go,
// C2 #ct2-drain): it refuses new streams, opens and acquires, marks every
// KeepAlive answer draining, pushes one draining notice per stream and waits
// up to Config.DrainTimeout for the streams to move, ending no session.
// With Config.CloseSessionsOnShutdown, Shutdown first sends every holder a
// lock-lost notice (SERVER_SHUTDOWN) for each of its locks and closes a
// session, releasing its locks, once its client acknowledged the notices or
// the trust last granted to it ran out (C5 #ct5-close-on-shutdown): for a
// planned stop where waiters should not wait for the TTL, without freeing a
// lock a client still trusts.
//
// # Telemetry
//
// The store emits the C4 events and metrics of what it does (sessions
// opened, closed and expired; locks acquired, released and revoked; acquire
// results; backend requests). The server adds only what the store cannot
// know: session_lost with reason client_silent and
// lockd_sessions_lost_total{reason="client_silent"} when it closes a silent
// client's session. Labels come only from fixed enums; the registry served
// by MetricsHandler holds lockd's metrics only.
package server
