package sessions

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"time"

	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// silenceHeap orders kept, live records by heapAt (a lower bound of
// expireAt): the silence loop sleeps until the earliest one.
type silenceHeap []*Record

func (h silenceHeap) Len() int           { return len(h) }
func (h silenceHeap) Less(i, j int) bool { return h[i].heapAt.Before(h[j].heapAt) }
func (h silenceHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *silenceHeap) Push(x any) {
	x.(*Record).heapIdx = len(*h)
	*h = append(*h, x.(*Record))
}
func (h *silenceHeap) Pop() any {
	old := *h
	n := len(old)
	x := old[n-1]
	old[n-1] = nil
	x.heapIdx = -1
	*h = old[:n-1]
	return x
}

// schedule puts r in the silence heap at its expireAt (t.mu held) and wakes
// the silence loop when it became the earliest. A record already in the heap
// whose expireAt only moved later (every heartbeat and grant) stays where it
// is: the silence loop finds the later expireAt when the record comes up and
// files it again, so a heartbeat costs no heap operation.
func (t *Table) schedule(r *Record) {
	if r.heapIdx >= 0 {
		if !r.expireAt.Before(r.heapAt) {
			return
		}
		r.heapAt = r.expireAt
		heap.Fix(&t.silence, r.heapIdx)
	} else {
		r.heapAt = r.expireAt
		heap.Push(&t.silence, r)
	}
	if r.heapIdx == 0 {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// unschedule removes r from the silence heap (t.mu held).
func (t *Table) unschedule(r *Record) {
	if r.heapIdx >= 0 {
		heap.Remove(&t.silence, r.heapIdx)
	}
}

// silenceLoop is the one goroutine that closes sessions whose clients fell
// silent. It sleeps until the earliest heapAt in the heap and exits when
// the table's context ends (Close).
func (t *Table) silenceLoop() {
	defer t.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		due, wait := t.sweep()
		for _, r := range due {
			t.closeSilent(r)
		}
		if len(due) > 0 {
			continue // closing took time: look again before sleeping
		}
		timer.Reset(wait)
		select {
		case <-t.ctx.Done():
			return
		case <-t.wake:
			timer.Stop() // Go ≥ 1.23 timers: no stale tick to drain
		case <-timer.C:
		}
	}
}

// sweep takes the records whose silence deadline passed out of the heap,
// moves a Live one to Expiring, and pins each for its close; it files
// again the records extended since they were filed, and returns how long
// to sleep until the next one.
func (t *Table) sweep() (due []*Record, wait time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	for len(t.silence) > 0 && !t.silence[0].heapAt.After(now.Add(refileAhead)) {
		if first := t.silence[0]; first.expireAt.After(now) {
			if !first.heapAt.Before(first.expireAt) {
				break // filed at its expireAt, which is still to come
			}
			// Extended since it was filed: file it at its expireAt.
			first.heapAt = first.expireAt
			heap.Fix(&t.silence, 0)
			continue
		}
		r := heap.Pop(&t.silence).(*Record)
		if r.state == Live && t.move(r, Expiring) {
			r.reason = telemetry.LostClientSilent
		}
		r.pins++ // held by the close
		due = append(due, r)
	}
	wait = time.Hour
	if len(t.silence) > 0 {
		wait = t.silence[0].heapAt.Sub(now)
	}
	return due, wait
}

// closeSilent closes a session whose client fell silent (r pinned by
// sweep, its close now in flight: expiring), or retries the close its
// client asked for (Closing). On failure it is filed again with backoff;
// the record keeps its state, so no reply extends trust meanwhile unless a
// call revives it.
func (t *Table) closeSilent(r *Record) {
	t.mu.Lock()
	if r.state == Live {
		// Revived since it was filed: a call reached this server and
		// filed it again.
		r.pins--
		t.dropIfDone(r)
		t.mu.Unlock()
		return
	}
	r.expiring = make(chan struct{})
	r.closeGen++
	reason := r.reason // read under t.mu: CloseSession may clear it meanwhile
	caller, by, rule := r.closeCaller, r.closeBy, r.closeRule
	t.mu.Unlock()
	defer t.settled(r)
	if t.ctx.Err() != nil {
		t.Unpin(r)
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, CloseTimeout)
	var (
		err     error
		already bool // the session was gone before: whoever ended it counted the loss
	)
	if reason == "" {
		// The client asked: unconditional, recorded as the caller's close.
		cctx := telemetry.WithServerClose(ctx)
		if caller {
			cctx = telemetry.WithCaller(ctx, by, rule)
		}
		_, err = t.be.CloseSession(cctx, r.id) // the store logs and counts the released locks
	} else {
		// Silence: only the backend may say the session is over (C2
		// #ct2-replicas); another replica may be keeping it alive.
		var ex store.Expiry
		ex, err = t.be.ExpireSession(ctx, r.id)
		if already = errors.Is(err, store.ErrSessionDead); already {
			err = nil
		} else if err == nil && !ex.Ended {
			cancel()
			t.retrySilent(r, ex.Remaining)
			return
		}
	}
	cancel()
	t.mu.Lock()
	defer t.mu.Unlock()
	r.pins--
	if err != nil {
		if t.ctx.Err() != nil || r.state == Gone {
			// Shutdown; or the store said gone meanwhile (a heartbeat,
			// a grant): nothing is left to close, and the record must
			// not be filed again (it would never be dropped).
			t.dropIfDone(r)
			return
		}
		r.closeAttempts++
		backoff := min(closeRetryMin<<min(r.closeAttempts, 10), closeRetryMax)
		t.log.LogAttrs(context.Background(), slog.LevelWarn, telemetry.EventSilenceCloseFailed,
			slog.String("error", err.Error()), slog.Int64("retry_in_ms", backoff.Milliseconds()))
		r.expireAt = t.now().Add(backoff)
		t.schedule(r)
		return
	}
	if reason != "" && !already && t.cfg.Lost != nil {
		t.cfg.Lost(r.id, reason)
	}
	if r.stream != nil {
		r.stream.push(&lockdv1.KeepAliveResponse{SessionId: string(r.id), Live: false})
	}
	t.markGoneLocked(r)
}

// settled ends the in-flight mark of a silence close: its outcome is
// recorded, replies waiting in lockSettled go on.
func (t *Table) settled(r *Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.expiring != nil {
		close(r.expiring)
		r.expiring = nil
	}
}

// retrySilent files a silent session again for when the backend's expiry
// comes: ExpireSession found it still alive (its expiry is just ahead, or
// another replica keeps it). The record stays Expiring, so this server
// extends nobody's trust in it meanwhile. r is pinned by the caller; the
// pin is released here.
func (t *Table) retrySilent(r *Record, rem time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r.pins--
	if r.state == Gone || t.ctx.Err() != nil {
		t.dropIfDone(r)
		return
	}
	r.closeAttempts = 0
	r.expireAt = t.now().Add(max(rem-expireEarly, 0))
	t.schedule(r)
}
