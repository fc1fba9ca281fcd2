package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/metadata"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// Watch implements the Watch RPC: one backend watch per call.
func (s service) Watch(req *lockdv1.WatchRequest, stream lockdv1.LockService_WatchServer) error {
	rctx := stream.Context()
	if err := store.ValidatePrefix(req.Prefix); err != nil {
		return s.toStatus(rctx, "Watch", invalid("prefix", err))
	}
	if err := s.refuseWhileStopping(); err != nil { // drain.go
		return s.toStatus(rctx, "Watch", err)
	}
	if len(req.ResumeAfter) > maxWatchCursor {
		return s.toStatus(rctx, "Watch", invalidf("resume_after", "longer than %d bytes", maxWatchCursor))
	}
	ctx, cancel := context.WithCancelCause(rctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.ctx, func() { cancel(errShuttingDown) })
	defer stop()
	// C2 #ct2-watch-resume: the store resumes after the client's cursor, or
	// says with a resync that it cannot.
	start, ch, err := s.st.WatchFrom(ctx, req.Prefix, req.ResumeAfter)
	if err != nil {
		return s.toStatus(rctx, "Watch", fmt.Errorf("watch: %w", err))
	}
	// Headers tell the client the watch is established, and where it
	// starts.
	if err := stream.SendHeader(metadata.Pairs(watchCursorHeader, start)); err != nil {
		return err
	}
	// Progress (C2 #ct2-watch-progress): one now, then one whenever the
	// caller got nothing for an interval. pos is the stream's position: a
	// resumed stream's stays the caller's own cursor until an event is sent
	// (its first may be a resync it has not had).
	pg := progress{on: req.Progress, pos: start}
	if req.ResumeAfter != "" {
		pg.pos = req.ResumeAfter
	}
	if pg.on {
		pg.interval = s.progressInterval()
		if err := pg.send(stream); err != nil {
			return err
		}
		pg.timer = time.NewTimer(pg.interval)
		defer pg.timer.Stop()
	}
	// Events are taken in batches of what is already queued, so that with
	// holder one read of a key serves all of its queued events (C2
	// #ct2-holder): the stream keeps up however slow one read is.
	var batch []store.Event
	for {
		var open bool
		batch, open = nextBatch(ch, batch[:0], pg.idle())
		if len(batch) == 0 && open {
			// The caller got nothing for an interval.
			if err := pg.send(stream); err != nil {
				return err
			}
			continue
		}
		if len(batch) == 0 && !open {
			break
		}
		var holders map[string]heldInfo
		if req.Holder {
			if holders, err = s.readHolders(ctx, batch); err != nil {
				return s.toStatus(rctx, "Watch", fmt.Errorf("watch: %w", err))
			}
		}
		for _, ev := range batch {
			if ev.Err != nil {
				return s.toStatus(rctx, "Watch", fmt.Errorf("watch: %w", ev.Err))
			}
			if ev.Kind == store.EventResync && req.ResumeAfter == "" {
				// A client that never resumes knows no resync: to it the
				// watch broke, as it did before (C2 #ct2-watch-resume).
				return s.toStatus(rctx, "Watch", fmt.Errorf("watch: %w: events may have been missed", store.ErrUnavailable))
			}
			resp := &lockdv1.WatchResponse{Kind: eventKind(ev.Kind), Key: ev.Key,
				SessionId: string(ev.Session), Token: ev.Token, Cursor: ev.Cursor}
			if needsHolder(ev, req.Holder) {
				if !req.Holder {
					continue // older clients know no value events
				}
				if !holders[ev.Key].fill(resp) && ev.Kind == store.EventValue {
					continue // the grant is gone: its value is nobody's
				}
			}
			if err := stream.Send(resp); errors.Is(err, errWatchDropped) {
				continue // the caller may not read the key: it got nothing
			} else if err != nil {
				return err
			}
			pg.sent(resp.Cursor)
		}
		if !open {
			break
		}
	}
	// The channel closed because ctx ended: the caller left, or Shutdown.
	return s.toStatus(rctx, "Watch", context.Cause(ctx))
}

// watchCursorHeader is the response header of Watch that carries the
// stream's start cursor, and maxWatchCursor the longest resume_after
// accepted (C2 #ct2-watch-resume).
const (
	watchCursorHeader = "lockd-watch-cursor"
	maxWatchCursor    = 256
)

func eventKind(k store.EventKind) lockdv1.EventKind {
	switch k {
	case store.EventResync:
		return lockdv1.EventKind_EVENT_KIND_RESYNC
	case store.EventAcquired:
		return lockdv1.EventKind_EVENT_KIND_ACQUIRED
	case store.EventReleased:
		return lockdv1.EventKind_EVENT_KIND_RELEASED
	case store.EventExpired:
		return lockdv1.EventKind_EVENT_KIND_EXPIRED
	case store.EventRevoked:
		return lockdv1.EventKind_EVENT_KIND_REVOKED
	case store.EventValue:
		return lockdv1.EventKind_EVENT_KIND_VALUE
	case store.EventMaxHold:
		return lockdv1.EventKind_EVENT_KIND_MAX_HOLD
	}
	return lockdv1.EventKind_EVENT_KIND_UNSPECIFIED
}
