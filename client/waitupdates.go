package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Waiting updates (C2 #ct2-wait-updates): an Acquire is one unary call, so
// WithWaitUpdates reads the key's queue with Inspect while it waits.
const (
	// DefaultWaitUpdateEvery is how often WithWaitUpdates reads the queue
	// when its every is 0.
	DefaultWaitUpdateEvery = time.Second
	// MinWaitUpdateEvery is the shortest every WithWaitUpdates accepts.
	MinWaitUpdateEvery = 100 * time.Millisecond
	// WaitUpdateDelay is how long an Acquire with WithWaitUpdates waits
	// before its first Inspect (or every, if shorter): an Acquire granted
	// sooner makes none.
	WaitUpdateDelay = 300 * time.Millisecond
)

// WaitUpdate is what WithWaitUpdates reports about a waiting Acquire.
type WaitUpdate struct {
	// Key is the key waited for.
	Key string
	// Position is the caller's session's place in the queue, 1 = next in
	// line; 0 when the read did not show it waiting (its wait not queued
	// yet, or the key being handed over).
	Position int
	// Waiters is the queue's length.
	Waiters int
	// Estimate is the server's estimate of the caller's wait from the
	// read (C2 #ct2-wait-estimate), valid only when HasEstimate: the server
	// gives none until it has seen holds of the key or its template. Not a
	// promise.
	Estimate    time.Duration
	HasEstimate bool
	// Info is the Inspect answer the update comes from: holder, token,
	// since when, waiters.
	Info LockInfo
	// Err is set, and the figures are empty, when the read failed. A
	// caller that may not Inspect the key gets Err matching
	// ErrPermissionDenied once and no more updates; the Acquire goes on.
	Err error
}

// WithWaitUpdates makes Acquire report its wait (C2 #ct2-wait-updates):
// while it waits it reads the key with Inspect — first WaitUpdateDelay
// after it starts (or every, if shorter), then every `every` (0:
// DefaultWaitUpdateEvery; below MinWaitUpdateEvery: ErrInvalidArgument) —
// and calls fn with the first answer and then whenever the position, the
// queue length, the estimate, the holder or the error changed. Without the
// option Acquire sends no Inspect; with it, an Acquire granted before the
// first read sends none either.
//
// fn runs on one goroutine the Acquire owns: calls never overlap, and
// Acquire stops the reads and waits for a call in progress before it
// returns, so fn is never called after Acquire returned. A slow fn delays
// the next read and Acquire's return, never the grant. The reads need
// read access to the key, as Inspect does: a caller who may lock the key but
// not read it gets one update with Err matching ErrPermissionDenied, then
// none; other failed reads are reported (Err) and the reads go on. None
// fails the Acquire. TryAcquire ignores the option; AcquireAll refuses it
// (ErrInvalidArgument).
func WithWaitUpdates(every time.Duration, fn func(WaitUpdate)) AcquireOption {
	return func(o *acquireOptions) { o.updates, o.updateEvery = fn, every }
}

// checkWaitUpdates checks WithWaitUpdates' every and returns the interval to
// use.
func checkWaitUpdates(ao acquireOptions) (time.Duration, error) {
	switch {
	case ao.updates == nil:
		return 0, nil
	case ao.updateEvery == 0:
		return DefaultWaitUpdateEvery, nil
	case ao.updateEvery < MinWaitUpdateEvery:
		return 0, fmt.Errorf("%w: wait updates every %v: at least %v", ErrInvalidArgument, ao.updateEvery, MinWaitUpdateEvery)
	}
	return ao.updateEvery, nil
}

// waitUpdates reads key's queue every `every` for fn until the returned stop
// is called; stop cancels a read in flight and waits for the goroutine, so
// fn is never called after it returns.
func (s *Session) waitUpdates(ctx context.Context, key string, every time.Duration, fn func(WaitUpdate)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // exits when stop cancels ctx (Acquire returned), or after a refused read
		defer wg.Done()
		w := updater{s: s, key: key, fn: fn}
		d := min(WaitUpdateDelay, every)
		for s.c.sleep(ctx, d) {
			sent := s.c.clock.Now()
			if !w.read(ctx, max(every, time.Second)) {
				return
			}
			d = every - s.c.clock.Now().Sub(sent)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// updater is one Acquire's reads and what it last reported.
type updater struct {
	s    *Session
	key  string
	fn   func(WaitUpdate)
	last *WaitUpdate
}

// read inspects the key once (bounded by bound) and reports what changed; it
// returns false when no more reads should follow.
func (w *updater) read(ctx context.Context, bound time.Duration) bool {
	ictx, cancel := context.WithTimeout(ctx, bound)
	info, err := w.s.c.Inspect(ictx, w.key)
	cancel()
	if ctx.Err() != nil || w.s.c.ctx.Err() != nil {
		return false // the Acquire returned or the client closed: report nothing more
	}
	u := WaitUpdate{Key: w.key, Err: err}
	if err == nil {
		for _, h := range info.Holders {
			if h.Session == w.s.id {
				return true // granted: the reply is on its way
			}
		}
		if info.Held && info.Session == w.s.id {
			return true
		}
		u.Info, u.Waiters = info, len(info.Waiters)
		for i, id := range info.Waiters {
			if id == w.s.id {
				u.Position = i + 1
			}
		}
		for _, e := range info.WaitEstimates {
			if e.Session == w.s.id {
				u.Estimate, u.HasEstimate = e.Wait, true
			}
		}
	}
	if w.last == nil || changed(*w.last, u) {
		w.last = &u
		w.fn(u)
	}
	return !errors.Is(err, ErrPermissionDenied)
}

// changed reports whether u differs from the last update reported in what
// WithWaitUpdates reports changes of.
func changed(last, u WaitUpdate) bool {
	return last.Position != u.Position || last.Waiters != u.Waiters || last.HasEstimate != u.HasEstimate ||
		last.Estimate.Milliseconds() != u.Estimate.Milliseconds() || last.Info.Held != u.Info.Held ||
		last.Info.Token != u.Info.Token || (last.Err == nil) != (u.Err == nil)
}
