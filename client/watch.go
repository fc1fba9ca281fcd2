package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wirelimits"
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
//
// The server sends progress messages on a quiet stream (C2
// #ct2-watch-progress); they never reach the channel. A stream silent for
// three of the server's progress intervals (at least 1 s) while Watch waits
// for it has lost its replica (stopped, hung, a path that drops packets):
// with several addresses that replica is set aside and the stream
// re-opened through another one, as for a broken stream.
func (c *Client) Watch(ctx context.Context, prefix string, opts ...WatchOption) (<-chan Event, error) {
	if err := wirelimits.ValidatePrefix(prefix); err != nil {
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
		defer w.end()
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
	// sctx is the stream's context; cancel ends it, with errSilent when
	// its silence guard found it silent.
	sctx   context.Context
	cancel context.CancelCauseFunc
	// quiet is the stream's silence guard; nil until a server told its
	// progress interval.
	quiet *silence
	// bound is the silence bound of the last progress interval a server
	// told (C2 #ct2-watch-progress); 0: none yet.
	bound time.Duration
	// cursor is where a re-opened stream resumes: the cursor of the last
	// event delivered, or the first stream's start; "" when the server
	// sends none (then a break ends the watch).
	cursor string
	// resync: the stream just opened cannot resume (a server that sends no
	// cursor); deliver EventResync before its events.
	resync bool
}

// errSilent is the cause that ends a stream silent for its silence bound.
var errSilent = errors.New("client: watch stream silent")

// open opens a stream from w.cursor, retrying with backoff until it is
// established, ctx ends or a refusal. Once a server has told its progress
// interval, an attempt whose headers do not come within the silence bound
// is abandoned (its replica set aside) and retried.
func (w *watcher) open(ctx context.Context) error {
	resume := w.cursor
	return w.c.retry(ctx, func(ctx context.Context) error {
		sctx, cancel := context.WithCancelCause(ctx)
		var wait *silence
		if w.bound > 0 {
			wait = newSilence(w.c.clock, w.bound, func() bool { cancel(errSilent); return true })
			wait.waiting(true)
		}
		stream, err := w.c.api.Watch(sctx, &lockdv1.WatchRequest{Prefix: w.prefix, Holder: w.opts.holders,
			ResumeAfter: resume, Progress: true})
		var md metadata.MD
		if err == nil {
			// Headers arrive once the server's watch is established.
			md, err = stream.Header()
			if err == nil && md == nil {
				_, err = stream.Recv() // ended without headers: the status says why
			}
		}
		wait.stop()
		if err != nil {
			if stream != nil && errors.Is(context.Cause(sctx), errSilent) {
				w.asideSilent(stream)
			}
			w.asideIfDraining(stream, err)
			cancel(nil)
			return w.streamErr(ctx, sctx, err)
		}
		// The stream's own guard starts with its first progress (sent
		// with the headers by a server that sends them): a server that
		// sends none, an older lockd, is never judged silent.
		w.stream, w.sctx, w.cancel = stream, sctx, cancel
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

// guard starts the current stream's silence guard: a stream silent for
// the bound is ended (errSilent) if its replica can be set aside, and kept
// otherwise (one address, or every other one set aside: nowhere better to
// go; C2 #ct2-watch-progress).
func (w *watcher) guard() {
	stream, cancel := w.stream, w.cancel
	w.quiet = newSilence(w.c.clock, w.bound, func() bool {
		if !w.asideSilent(stream) {
			return false
		}
		cancel(errSilent)
		return true
	})
}

// asideSilent sets aside the replica of a silent stream as stalled (C2
// #ct2-failover); false when there is nowhere else to go.
func (w *watcher) asideSilent(stream lockdv1.LockService_WatchClient) bool {
	if w.c.failover == nil {
		return false
	}
	p, ok := peer.FromContext(stream.Context())
	return ok && w.c.failover.setAside(p.Addr, false)
}

// streamErr maps the error that ended a stream, or an attempt to open one:
// ErrUnavailable when its silence guard ended it.
func (w *watcher) streamErr(ctx, sctx context.Context, err error) error {
	if ctx.Err() == nil && errors.Is(context.Cause(sctx), errSilent) {
		return fmt.Errorf("%w: watch stream silent for %v (its replica stalled)", ErrUnavailable, w.bound)
	}
	return fromStatus(ctx, err)
}

// end ends the current stream and its silence guard.
func (w *watcher) end() {
	w.quiet.stop()
	w.quiet = nil
	if w.cancel != nil {
		w.cancel(nil)
	}
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
		// Silence counts only while waiting here: a consumer slow to read
		// ch does not make the stream look silent.
		w.quiet.waiting(true)
		r, err := w.stream.Recv()
		w.quiet.waiting(false)
		if err != nil && w.cursor != "" && ctx.Err() == nil {
			if rerr := w.streamErr(ctx, w.sctx, err); retryable(rerr) {
				w.asideIfDraining(w.stream, err)
				w.end()
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
				w.deliver(ctx, ch, Event{Err: fmt.Errorf("watch %q: %w", w.prefix, w.streamErr(ctx, w.sctx, err))})
			}
			return
		}
		if r.GetKind() == lockdv1.EventKind_EVENT_KIND_PROGRESS {
			w.progress(r)
			continue
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

// progress takes a progress message (C2 #ct2-watch-progress). It is no
// event: it moves the cursor (every event sent before it has been
// delivered, in order, by this goroutine) and tells the progress interval,
// hence the silence bound, which starts the stream's silence guard.
func (w *watcher) progress(r *lockdv1.WatchResponse) {
	if c := r.GetCursor(); c != "" {
		w.cursor = c
	}
	ms := r.GetProgressIntervalMs()
	if ms <= 0 {
		return
	}
	w.bound = silenceBound(time.Duration(ms) * time.Millisecond)
	if w.quiet == nil {
		w.guard() // the stream's first progress
	} else {
		w.quiet.setBound(w.bound)
	}
}

// silenceBound is how long a watch stream may stay silent before it counts
// as broken: three progress intervals, at least minSilence (C2
// #ct2-watch-progress). The server sends a progress after one interval of
// silence; the other two absorb a progress late on a loaded machine.
func silenceBound(interval time.Duration) time.Duration { return max(3*interval, minSilence) }

// minSilence is the shortest silence bound.
const minSilence = time.Second

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
