package client

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/peer"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// watchCursorHeader is the Watch response header that carries the stream's
// start cursor (C2 #ct2-watch-resume).
const watchCursorHeader = "lockd-watch-cursor"

// Watch reports every change to the keys that start with prefix, in commit
// order. It returns once the watch is established: every change committed
// after it returns is delivered. When the stream breaks (its replica died,
// drained or stalled; the backend's watch broke) it is re-opened, through
// any replica, right after the last event delivered, with backoff until ctx
// ends: on etcd every event after the last one delivered arrives exactly
// once; where the server cannot tell what happened meanwhile (PostgreSQL,
// compacted etcd history, an older lockd) an EventResync comes first and
// the watch goes on (C2 #ct2-watch-resume). The channel closes when ctx
// ends or the client closes, or after one event with Err set when the
// watch breaks and cannot be re-opened. A watch whose ctx ends (or whose
// client closes) while it is re-opening a broken stream sends, if the
// channel has room, a last event whose Err wraps why the stream broke
// (e.g. ErrUnavailable) and why it was not re-opened (ctx's error): a
// consumer can tell a watch that ended disconnected from one it cancelled
// while it was connected.
func (c *Client) Watch(ctx context.Context, prefix string, opts ...WatchOption) (<-chan Event, error) {
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("watch %q: %w", prefix, invalidInput("prefix", err))
	}
	w := &watcher{c: c, prefix: prefix}
	for _, opt := range opts {
		opt(&w.opts)
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	if err := w.open(wctx); err != nil {
		stop()
		cancel()
		return nil, fmt.Errorf("watch %q: %w", prefix, err)
	}
	ch := make(chan Event, 64)
	c.wg.Add(1)
	go func() { // exits when ctx or the client ended, or the watch broke for good
		defer c.wg.Done()
		defer close(ch)
		defer cancel()
		defer stop()
		w.run(wctx, ch)
	}()
	return ch, nil
}

// watcher is one Watch: its current stream and the cursor of the last
// event it delivered. Only Watch and then its goroutine use it.
type watcher struct {
	c      *Client
	prefix string
	opts   watchOptions

	stream lockdv1.LockService_WatchClient
	// cursor is where a re-opened stream resumes: the cursor of the last
	// event delivered, or the first stream's start; "" when the server
	// sends none (then a break ends the watch).
	cursor string
	// resync: the stream just opened cannot resume (a server that sends no
	// cursor); deliver EventResync before its events.
	resync bool
}

// open opens a stream from w.cursor, retrying with backoff until it is
// established, ctx ends or a refusal.
func (w *watcher) open(ctx context.Context) error {
	resume := w.cursor
	return w.c.retry(ctx, func(ctx context.Context) error {
		stream, err := w.c.api.Watch(ctx, &lockdv1.WatchRequest{Prefix: w.prefix, Holder: w.opts.holders, ResumeAfter: resume})
		if err != nil {
			return fromStatus(ctx, err)
		}
		// Headers arrive once the server's watch is established.
		md, err := stream.Header()
		if err == nil && md == nil {
			_, err = stream.Recv() // ended without headers: the status says why
		}
		if err != nil {
			w.asideIfDraining(stream, err)
			return fromStatus(ctx, err)
		}
		w.stream = stream
		start := md.Get(watchCursorHeader)
		switch {
		case resume == "":
			if len(start) == 1 {
				w.cursor = start[0]
			}
		case len(start) != 1:
			// A server that cannot resume (an older lockd) started from
			// now: what happened meanwhile is unknown.
			w.cursor, w.resync = "", true
		}
		return nil
	})
}

// run delivers the events of w's streams to ch, re-opening a stream that
// broke from the last cursor delivered.
func (w *watcher) run(ctx context.Context, ch chan<- Event) {
	for {
		if w.resync {
			w.resync = false
			if !w.deliver(ctx, ch, Event{Kind: EventResync}) {
				return
			}
		}
		r, err := w.stream.Recv()
		if err != nil && w.cursor != "" && ctx.Err() == nil {
			if rerr := fromStatus(ctx, err); retryable(rerr) {
				w.asideIfDraining(w.stream, err)
				w.c.log.LogAttrs(ctx, slog.LevelDebug, "watch resuming", slog.String("error", rerr.Error()))
				oerr := w.open(ctx)
				if oerr == nil {
					continue
				}
				// ctx ended (or the client closed) before the stream
				// was re-opened: the watch ended disconnected, which
				// the consumer must be able to tell from a watch it
				// cancelled while connected. The channel has room
				// unless the consumer stopped reading; never block.
				select {
				case ch <- Event{Err: fmt.Errorf("watch %q: %w (not resumed: %w)", w.prefix, rerr, oerr)}:
				default:
				}
				return
			}
		}
		if err != nil {
			if ctx.Err() == nil {
				w.deliver(ctx, ch, Event{Err: fmt.Errorf("watch %q: %w", w.prefix, fromStatus(ctx, err))})
			}
			return
		}
		// The proto's EventKind numbers the kinds as EventKind does.
		ev := Event{Kind: EventKind(r.GetKind()), Key: r.GetKey(), Session: r.GetSessionId(), Token: r.GetToken(),
			Owner: r.GetOwner(), Labels: r.GetLabels(), Value: r.GetValue()}
		if !w.deliver(ctx, ch, ev) {
			return
		}
		// Only a delivered event moves the cursor: a stream that breaks
		// before resumes right after it.
		if c := r.GetCursor(); c != "" {
			w.cursor = c
		}
	}
}

// deliver sends ev on ch unless ctx ends first.
func (w *watcher) deliver(ctx context.Context, ch chan<- Event, ev Event) bool {
	select {
	case ch <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// asideIfDraining sets aside the replica of a stream that ended because
// it shuts down (SHUTTING_DOWN), so that the next stream goes elsewhere
// (C2 #ct2-failover).
func (w *watcher) asideIfDraining(stream lockdv1.LockService_WatchClient, err error) {
	if w.c.failover == nil || stream == nil || !isShuttingDown(err) {
		return
	}
	if p, ok := peer.FromContext(stream.Context()); ok {
		w.c.failover.setAside(p.Addr, true)
	}
}
