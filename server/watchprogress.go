package server

import (
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
)

// progress is the progress state of one Watch stream (C2
// #ct2-watch-progress).
type progress struct {
	on       bool          // the request asked for progress
	interval time.Duration // the progress interval
	timer    *time.Timer   // fires after an interval of nothing sent
	pos      string        // the stream's position: the last cursor sent
}

// progressInterval is the Watch progress interval: the heartbeat interval
// advertised for a session of the default TTL (C2 #ct2-watch-progress).
func (s *Server) progressInterval() time.Duration {
	_, hb := s.advertised(s.cfg.SessionTTL)
	return hb
}

// idle is the channel that fires when a progress is due; nil without
// progress.
func (p *progress) idle() <-chan time.Time {
	if !p.on {
		return nil
	}
	return p.timer.C
}

// send sends a progress and restarts the interval.
func (p *progress) send(stream lockdv1.LockService_WatchServer) error {
	err := stream.Send(&lockdv1.WatchResponse{Kind: lockdv1.EventKind_EVENT_KIND_PROGRESS, Cursor: p.pos,
		ProgressIntervalMs: p.interval.Milliseconds()})
	p.restart()
	return err
}

// sent records an event the caller got: its cursor is the position, and
// the interval starts again.
func (p *progress) sent(cursor string) {
	if cursor != "" {
		p.pos = cursor
	}
	p.restart()
}

func (p *progress) restart() {
	if p.on && p.timer != nil {
		p.timer.Reset(p.interval)
	}
}
