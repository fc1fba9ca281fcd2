package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/test/chaos/check"
	"lock.dev/lockd/test/chaos/fenced"
	"lock.dev/lockd/test/chaos/history"
	"lock.dev/lockd/test/chaos/worker"
)

// Issue 15: semaphores and read/write locks under pauses and kills.

// MultiPauseKill runs multiWorkers workers: the first multiRWFirst take one
// key as a semaphore of multiLimit, the others another key as a
// read/write lock (shared or exclusive grants, worker.ExclusiveShare).
// Cycle i pauses (like PauseHolder) or kills (like KillHolder) a holder of
// the semaphore (even i) or of the read/write lock (odd i): pauses in
// cycles 0–1 (mod 4), kills in cycles 2–3.
const MultiPauseKill Fault = "multi-pause-kill"

// Controls of MultiPauseKill.
const (
	// SemExtra makes the semaphore's workers ask for a limit one above
	// multiLimit, while the checkers and the fenced resource keep
	// multiLimit: lockd admits an extra holder, and check.TooManyTrusted
	// and check.TooManyWriters must each find it on the semaphore key.
	// Its cycle first keeps every semaphore worker's hold line unanswered
	// until all multiLimit+1 hold at once (holdBarrier), so the extra
	// holder trusts and acts beside the others by construction.
	SemExtra Control = "sem-extra"
	// IgnoreDone turns the fenced resource's check off and runs the first
	// worker of each key with worker.TrustIgnoreDone, pausing it while it
	// holds (a slot in even cycles, a shared grant in odd ones): a holder
	// that keeps its slot after lockd gave it to another, a reader that
	// keeps trusting past a writer's grant. check.TooManyTrusted and
	// check.TooManyWriters must find it on both keys, check.FencedSafety
	// the reader's accepted read after the writer's write. The pause of the
	// slot holder lasts until the other two semaphore workers hold at once
	// (holdBarrier: three trusted and acting), the reader's until an
	// exclusive grant's write is accepted (pauseHolderWith): each window
	// made, not waited for.
	IgnoreDone Control = "ignore-done"
)

const (
	multiWorkers = 6
	multiRWFirst = 3 // workers [0, multiRWFirst) take the semaphore
	multiLimit   = 2
)

// multi reports whether the scenario is one of issue 15's.
func (r *run) multi() bool { return r.spec.Fault == MultiPauseKill }

// multiKeys names the semaphore and the read/write key and their kinds.
func (r *run) multiKeys() {
	sem := fmt.Sprintf("chaos/%s/sem", r.spec.Name)
	rw := fmt.Sprintf("chaos/%s/rw", r.spec.Name)
	r.keys = []string{sem, rw}
	r.kinds = map[string]check.Kind{sem: {Limit: multiLimit}, rw: {RW: true}}
}

// planMulti sets worker slot's key, kind and (for IgnoreDone) trust.
func (r *run) planMulti(slot int, ws *workerSpec) {
	if slot < multiRWFirst {
		ws.keys, ws.limit = r.keys[:1], multiLimit
		if r.spec.breaks(SemExtra) {
			ws.limit = multiLimit + 1
		}
	} else {
		ws.keys, ws.rw = r.keys[1:], true
	}
	if r.spec.breaks(IgnoreDone) && (slot == 0 || slot == multiRWFirst) {
		ws.trust = worker.TrustIgnoreDone
	}
}

// multiCycle runs fault cycle i of MultiPauseKill.
func (r *run) multiCycle(ctx context.Context, i int) error {
	if r.spec.Control == IgnoreDone {
		if i%2 == 0 {
			// Slot holder 0 paused until workers 1 and 2 hold the other
			// slots at once: three trusted, three acting.
			return r.pauseHolderWith(ctx, func(w *workerProc) bool { return w.slot == 0 }, nil,
				func(ctx context.Context, _ *workerProc) error {
					return r.gather(ctx, r.semWorkers(func(w *workerProc) bool { return w.slot != 0 }), multiLimit)
				})
		}
		return r.pauseHolderWhere(ctx, func(w *workerProc) bool { return w.slot == multiRWFirst },
			func(w *workerProc) bool { return w.holdMode() == fenced.ModeShared })
	}
	if r.spec.Control == SemExtra && i == 0 {
		if err := r.gather(ctx, r.semWorkers(nil), multiLimit+1); err != nil {
			return err
		}
	}
	sem := i%2 == 0
	filter := func(w *workerProc) bool { return (w.slot < multiRWFirst) == sem }
	if (i/2)%2 == 0 {
		return r.pauseHolderWhere(ctx, filter, nil)
	}
	return r.killHolderWhere(ctx, filter)
}

// semWorkers returns the current semaphore workers that filter (if set)
// accepts.
func (r *run) semWorkers(filter func(*workerProc) bool) []*workerProc {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ws []*workerProc
	for _, w := range r.workers {
		if w.slot < multiRWFirst && (filter == nil || filter(w)) {
			ws = append(ws, w)
		}
	}
	return ws
}

// gather keeps the hold lines of ws unanswered until n of them hold the
// semaphore at once (holdBarrier), then lets them go. With the control's
// break on, lockd admits them and it fails after triggerTimeout with a
// message saying how many held. With the break off (Spec.BreakOff, where
// lockd keeps the limit the barrier goes beyond) it gives up after
// gatherOff and lets them go.
func (r *run) gather(ctx context.Context, ws []*workerProc, n int) error {
	b := newHoldBarrier(n)
	b.arm(ws)
	defer b.open(ws)
	limit := triggerTimeout
	if r.spec.BreakOff && n > multiLimit {
		limit = gatherOff(r.opts.TTL)
	}
	got, err := b.wait(ctx, limit)
	if err != nil {
		return err
	}
	if got < n {
		if r.spec.BreakOff && n > multiLimit {
			r.logf("control (break off): %d of %d semaphore workers held at once within %v (lockd keeps the limit)", got, n, limit)
			return nil
		}
		return fmt.Errorf("%d of %d semaphore workers held at once within %v", got, n, limit)
	}
	r.logf("%d semaphore workers hold at once (their hold lines unanswered until all did)", n)
	return nil
}

// gatherOff bounds gather beyond the limit with the break off: two TTLs,
// in which every semaphore worker asks again many times.
func gatherOff(ttl time.Duration) time.Duration { return 2 * ttl }

// startSlotClient connects the fenced resource's slot check (the multi
// scenarios) and UpstreamHold's look at lockd's queue to lockd (both run
// one replica).
func (r *run) startSlotClient() error {
	if !r.multi() && r.spec.Fault != UpstreamHold {
		return nil
	}
	c, err := client.New(r.lockds[0].Addr())
	if err != nil {
		return fmt.Errorf("slot check client: %w", err)
	}
	r.slotClient.Store(c)
	return nil
}

// slotCheck is the fenced resource's SlotCheck: whether token is a
// current grant of key, from lockd's CheckToken (linearizable, C2
// #ct2-check-token; issue 26 dogfoods it here).
func (r *run) slotCheck(ctx context.Context, key string, token uint64) (bool, error) {
	c := r.slotClient.Load()
	if c == nil {
		return false, errors.New("no lockd client for the slot check")
	}
	res, err := c.CheckToken(ctx, key, token, client.CheckOptions{})
	if err != nil {
		return false, err
	}
	return res.Current, nil
}

// KeyChecks are the multi checkers' results on one key.
type KeyChecks struct {
	Fenced, Writers, Trusted check.Result
}

// evaluateMulti replaces the plain lock's checkers of overlap by the
// multi ones (the kinds' limits) and runs them per key too, for the
// controls' verdicts.
func (r *run) evaluateMulti(rep *Report, h history.History, writes []fenced.Write) {
	rep.Kinds = r.kinds
	rep.Overlapping = check.TooManyWriters(writes, r.kinds)
	rep.Trusted = check.TooManyTrusted(h, r.kinds)
	rep.LinSkipped = true
	rep.Linearizable = check.Result{Checker: "linearizable", Notes: []string{
		"not run: its model is the plain lock; trusted-within-kind and writers-within-kind check semaphores and read/write locks"}}
	rep.PerKey = map[string]KeyChecks{}
	for key := range r.kinds {
		var hk history.History
		for _, op := range h {
			if op.Key == key || op.Kind == history.Crash {
				hk = append(hk, op)
			}
		}
		var wk []fenced.Write
		for _, w := range writes {
			if w.Key == key {
				wk = append(wk, w)
			}
		}
		rep.PerKey[key] = KeyChecks{Fenced: check.FencedSafety(wk), Writers: check.TooManyWriters(wk, r.kinds),
			Trusted: check.TooManyTrusted(hk, r.kinds)}
	}
}

// multiKey returns the per-key results of the semaphore key (rw false) or
// of the read/write key.
func (rep *Report) multiKey(rw bool) (string, KeyChecks) {
	for key, k := range rep.Kinds {
		if k.RW == rw {
			return key, rep.PerKey[key]
		}
	}
	return "", KeyChecks{}
}

// multiVerdict is the verdict of a MultiPauseKill control: each listed
// checker must have found its violation on its key.
func (rep *Report) multiVerdict() (bool, string) {
	type need struct {
		what string
		res  check.Result
	}
	semKey, sem := rep.multiKey(false)
	rwKey, rw := rep.multiKey(true)
	needs := []need{
		{"more than N trusted holders of " + semKey, sem.Trusted},
		{"more than N writers acting on " + semKey, sem.Writers},
	}
	if rep.Spec.Control == IgnoreDone {
		needs = append(needs,
			need{"a reader trusted with a writer on " + rwKey, rw.Trusted},
			need{"a reader acting across a writer on " + rwKey, rw.Writers},
			need{"a reader's read accepted after a later writer's write on " + rwKey, rw.Fenced})
	}
	for _, n := range needs {
		if n.res.Violations == 0 {
			return false, "control did not fail: not found: " + n.what
		}
	}
	return true, "control failed as it must"
}
