package server

import "context"

// closeAll closes every session of this server (CloseSessionsOnShutdown,
// C5 #ct5-close-on-shutdown) without freeing a lock its client may still
// trust: the session table moves every session to Draining, sends a
// lock-lost notice (SERVER_SHUTDOWN) for every lock it tracks, and closes a
// session only once the client acknowledged all of the session's notices,
// or the trust this server last granted it ran out (sessions.Table.CloseAll).
// Sessions still unsafe to close when ctx ends are left to expire, never
// closed early.
func (s *Server) closeAll(ctx context.Context) error { return s.sess.CloseAll(ctx) }

// The graceful drain (C2 #ct2-drain, C5 #ct5-drain): a replica shutting
// down without close-sessions-on-shutdown refuses new streams, opens and
// acquires, marks every KeepAlive answer draining, pushes one draining
// notice on every open KeepAlive stream and waits until those streams have
// ended (their clients moved to another replica) or the drain timeout
// passed. It ends no session: the backend keeps each one for its TTL after
// this replica's last keepalive or heartbeat, and another replica adopts it.
// The session table keeps the stream registry (sessions.Table.Drain).

// refuseWhileStopping is the entry check of calls a draining or stopping
// replica no longer takes (OpenSession, Acquire, Watch, KeepAlive):
// errShuttingDown, which the client retries elsewhere. Once Shutdown ended
// the streams and waits (s.ctx) a retry of what that broke can still reach
// this replica before its connection is told to go away; it is refused
// rather than served by a stream about to end (C2 #ct2-stopping-refuses).
func (s *Server) refuseWhileStopping() error {
	if s.ctx.Err() != nil || s.sess.Draining() {
		return errShuttingDown
	}
	return nil
}

// drain tells every attached client to move and waits until every KeepAlive
// stream has ended, Config.DrainTimeout has passed, or ctx ended.
func (s *Server) drain(ctx context.Context) { s.sess.Drain(ctx, s.cfg.DrainTimeout) }
