// Package client is the Go SDK of lockd, a distributed lock service with
// sessions, FIFO waiting and fencing tokens.
//
//	c, err := client.New("127.0.0.1:7420")
//	defer c.Close()
//	s, err := c.NewSession(ctx)
//	l, err := s.Acquire(ctx, "jobs/nightly")
//	// ... work under l.Context(), passing l.Token() to the resource ...
//	err = l.Release(ctx)
//
// or simply client.Do(ctx, c, "jobs/nightly", fn).
//
// # Trust and deadlines
//
// A lock is trusted only while its session is. Every reply that extends
// trust (OpenSession, a heartbeat answer, a grant) carries Remaining, a lower
// bound of how long the backend keeps the session measured from when the
// server received the request. The SDK trusts the session until
//
//	t_send + Remaining − safety margin
//
// where t_send is the client's own monotonic time when it SENT the request
// (the injected Clock; the real one is time.Now with its monotonic reading).
// It keeps the later of the current deadline and a new one. Session.Done and
// every Lock.Done close, and Lock.Context is cancelled, at that instant
// unless a newer reply extended it — also while the server is unreachable,
// since no reply is needed to stop trusting. Because t_send precedes the
// server's receipt, the client stops trusting at least the safety margin
// before the backend could give the key to anyone else
// (docs/contracts/C2.md #ct2-deadline; the argument and what every SDK must
// do: docs/safety.md). A reply saying the session is dead ends it; a lock-lost
// notice (an admin revoke) ends that lock only. Revocation breaks the promise
// on purpose: pass Lock.Token to the resource so that it rejects a superseded
// holder.
//
// All sessions of a Client send their heartbeats over one shared KeepAlive
// stream, every heartbeat interval (advertised by the server, default
// TTL/3; a Client's sessions of one interval together, at a random phase
// per Client), and reconnect with backoff when it breaks.
//
// # Leader election
//
// Session.Campaign waits in an election's FIFO queue until the session
// leads it; the Leadership it returns has the fencing token of its grant,
// a Done channel like a Lock's, Proclaim (a new value, same token) and
// Resign. Client.Observe streams the leader — session, owner, value, token —
// and "no leader" whenever there is none. An election is the lock named by
// its name (docs/contracts/C2.md #ct2-election): access rules apply as for
// locks.
//
// # Several replicas
//
// New also takes several replicas of one backend, "a:7420,b:7420,c:7420"
// (or WithAddresses), or a DNS name, "dns:///lockd.example:7420". The
// client talks to one replica at a time (gRPC's pick_first) and moves its
// stream and pending calls to another when that replica's connection
// breaks, when it says it drains, or when its stream stalls (a heartbeat
// unanswered, and nothing received, for half a heartbeat interval). The
// move keeps every session, lock and queue place on a backend whose
// sessions every replica can use, and never extends trust without an
// answer: Lock.Done does not fire when the new replica answers in time.
// The stream it leaves (drained or stalled) is not cut: answers to the
// heartbeats in flight there still count when they arrive. Notice
// acknowledgements go only to the replica that sent the notice, on a stream
// the client still sends on (docs/contracts/C2.md #ct2-failover).
//
// A waiting Acquire keeps its place in the key's FIFO queue across retries
// and across the server's 10-minute maximum wait; when it returns without
// a grant the place is given up (C2 #ct2-keep-place).
//
// # Errors
//
// Retryable errors (the server or its backend unavailable, contention, not
// leader) are retried with backoff inside the SDK until the caller's
// context ends; the error then matches both ctx.Err() and ErrUnavailable.
// Terminal conditions are the exported sentinels (ErrSessionDead,
// ErrSessionExpired, ErrNotOwner, ErrInvalidArgument, ErrLocked,
// ErrWaitTimeout, ErrLockLost, ...), usable with errors.Is. Cancellation
// returns an error matching ctx.Err(). errors.go is the one place where gRPC
// codes map back to them.
package client
