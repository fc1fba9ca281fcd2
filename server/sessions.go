package server

import (
	"time"

	"lock.dev/lockd/server/internal/sessions"
	"lock.dev/lockd/store"
)

// The server's session state lives in one owned type, the session table
// (server/internal/sessions: its doc.go has the states and their allowed
// transitions). The handlers call its methods and never lock it; this file
// wires it to the server.

// closeTimeout bounds the server's own background store calls (closes,
// reconciling reads), as it bounds the table's.
const closeTimeout = sessions.CloseTimeout

// errCloseOverlap answers a call whose store answer overlapped a silence
// close of its session on this replica (C2 #ct2-replicas): retryable, it
// extends nothing; the retry adopts the session again.
var errCloseOverlap = sessions.ErrCloseOverlap

// newTable builds the session table of s and starts its silence loop.
func (s *Server) newTable() *sessions.Table {
	return sessions.New(sessions.Config{
		MaxTTL:               s.cfg.MaxTTL,
		MaxSessions:          s.cfg.MaxSessions,
		MaxSessionOpens:      s.cfg.MaxSessionOpens,
		MaxLocksPerSession:   s.cfg.MaxLocksPerSession,
		MaxSessionsPerStream: MaxSessionsPerStream,
		SharedSessions:       s.st.SharesSessions(),
		Log:                  s.log,
		Lost: func(id store.SessionID, reason string) {
			s.tlog.SessionLost(id, reason)
			s.metrics.SessionLost(reason)
		},
		Ended: func(key string, held time.Duration) {
			tmpl := s.stats.Template(key)
			s.stats.Held(tmpl, held)
			s.hot.Held(key, held)
			s.est.Held(key, tmpl, held)
		},
	}, s.st)
}
