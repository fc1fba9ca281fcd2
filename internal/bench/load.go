package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// keysPerClient is how many keys each client of the distinct scenario
// cycles through. A bounded key set is what real workloads (job names,
// resource ids) look like; it also bounds lockd's per-key release markers
// on etcd.
const keysPerClient = 16

// loadResult is one measurement of a load.
type loadResult struct {
	// ops counts pairs (distinct) or acquisitions (contended) completed
	// in the window.
	ops int
	// elapsed is the measured window.
	elapsed time.Duration
	// lat holds the latency of every pair (distinct), hand-over
	// (election) or wait for a slot (semaphore).
	lat []time.Duration
	// obsLat holds, for every hand-over whose new leader the observer
	// reported, the time until it did (election).
	obsLat []time.Duration
	// perClient counts acquisitions per client.
	perClient []int
	// most is the most clients that held a slot at once (semaphore).
	most int
	// cpu is the CPU time each process of the system (by role: client,
	// server, backend) used in the window, when it was metered.
	cpu map[string]time.Duration
}

// rate is ops per second of the window.
func (r loadResult) rate() Value {
	if r.elapsed <= 0 {
		return 0
	}
	return Value(float64(r.ops) / r.elapsed.Seconds())
}

// observedPct is the share of the hand-overs whose new leader the observer
// reported, in percent (election); NaN without hand-overs.
func (r loadResult) observedPct() Value {
	if r.ops == 0 {
		return Value(math.NaN())
	}
	return Value(float64(len(r.obsLat)) * 100 / float64(r.ops))
}

// load runs one kind of load on clients: a warm-up of at least warm, then
// the measured window of dur; tag makes its keys unique.
type load func(ctx context.Context, clients []locker, warm, dur time.Duration, tag string) (loadResult, error)

// warmupFor is the unmeasured warm-up before a measurement of dur: a fifth
// of it, at most a second.
func warmupFor(dur time.Duration) time.Duration { return min(dur/5, time.Second) }

// measure opens c clients of sys, runs run on them, closes the clients, and
// returns the measured result.
func measure(ctx context.Context, sys system, c int, dur time.Duration, tag string, run load) (loadResult, error) {
	if p, ok := sys.(preparer); ok {
		done, err := p.prepare(ctx, c)
		if err != nil {
			return loadResult{}, err
		}
		defer done() // after the clients closed (deferred below, run first)
	}
	clients := make([]locker, c)
	err := parallel(ctx, c, setupWidth, func(ctx context.Context, i int) error {
		l, err := sys.open(ctx)
		clients[i] = l
		return err
	})
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = parallel(cctx, c, setupWidth, func(ctx context.Context, i int) error {
			if clients[i] != nil {
				return clients[i].close(ctx)
			}
			return nil
		})
	}()
	if err != nil {
		return loadResult{}, fmt.Errorf("%s: open %d clients: %w", sys.name(), c, err)
	}
	var res loadResult
	pprof.Do(ctx, pprof.Labels(labelSystem, sys.name()), func(ctx context.Context) {
		res, err = run(ctx, clients, warmupFor(dur), dur, tag)
	})
	if err != nil {
		return loadResult{}, fmt.Errorf("%s: %w", sys.name(), err)
	}
	return res, nil
}

// distinctLoad has every client acquire and release keys of its own, one
// pair after another: for warm (on keys of their own), then for dur. The
// measured window ends when the last client finished its last pair.
func distinctLoad(ctx context.Context, clients []locker, warm, dur time.Duration, tag string) (loadResult, error) {
	return distinctRun(ctx, clients, warm, dur, tag, false)
}

// takeLoad is distinctLoad whose latencies are of the acquire alone (the
// acquire-all scenario's take of a set), not of the pair.
func takeLoad(ctx context.Context, clients []locker, warm, dur time.Duration, tag string) (loadResult, error) {
	return distinctRun(ctx, clients, warm, dur, tag, true)
}

// distinctRun is distinctLoad, timing the acquire alone when takeOnly.
func distinctRun(ctx context.Context, clients []locker, warm, dur time.Duration, tag string, takeOnly bool) (loadResult, error) {
	if warm > 0 {
		if _, err := distinctRun(withoutCPUWindow(ctx), clients, 0, warm, tag+"-warm", takeOnly); err != nil {
			return loadResult{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lats := make([][]time.Duration, len(clients))
	windowOpened(ctx)
	start := time.Now()
	deadline := start.Add(dur)
	var wg sync.WaitGroup
	for ci, l := range clients {
		wg.Add(1)
		go func() { // exits at the deadline or on the first error
			defer wg.Done()
			prefix := tag + "/c" + strconv.Itoa(ci) + "/k"
			for i := 0; time.Now().Before(deadline); i++ {
				t0 := time.Now()
				release, err := l.acquire(ctx, prefix+strconv.Itoa(i%keysPerClient))
				took := time.Since(t0)
				if err == nil {
					err = release(ctx)
				}
				if err != nil {
					cancel(fmt.Errorf("client %d, pair %d: %w", ci, i, err))
					return
				}
				if !takeOnly {
					took = time.Since(t0)
				}
				lats[ci] = append(lats[ci], took)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	windowClosed(ctx)
	if err := context.Cause(ctx); err != nil {
		return loadResult{}, err
	}
	res := loadResult{elapsed: elapsed, perClient: make([]int, len(clients))}
	for ci, l := range lats {
		res.ops += len(l)
		res.perClient[ci] = len(l)
		res.lat = append(res.lat, l...)
	}
	return res, nil
}

// firstGrantTimeout bounds the wait for the grant that opens the window
// of the contended load.
const firstGrantTimeout = time.Minute

// contendedLoad has every client loop acquire/release on one key. The
// measured window opens at the first grant after warm has passed (so the
// clients have queued up, and the window holds at least one grant however
// slow the system) and lasts dur; waiting acquires are then cancelled. It
// counts the acquisitions granted inside the window: in this saturated loop
// each one is a hand-over from the previous holder.
func contendedLoad(ctx context.Context, clients []locker, warm, dur time.Duration, tag string) (loadResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	wctx, wcancel := context.WithCancel(ctx) // ends the waiting after the window
	defer wcancel()
	start := time.Now()
	key := tag + "/key"
	warmEnd := start.Add(warm)
	win := startWindow(ctx, cancel, wcancel, dur, "grant")
	grants := make([][]time.Time, len(clients))
	var wg sync.WaitGroup
	for ci, l := range clients {
		wg.Add(1)
		go func() { // exits when the window ends or on the first error
			defer wg.Done()
			for wctx.Err() == nil {
				release, err := l.acquire(wctx, key)
				if err != nil {
					if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
						// The server may report the end a moment before
						// this process's context shows it.
						select {
						case <-wctx.Done():
						case <-time.After(time.Second):
						}
					}
					if wctx.Err() != nil && ctx.Err() == nil {
						return // the window ended while waiting
					}
					cancel(fmt.Errorf("client %d acquire: %w", ci, err))
					return
				}
				at := time.Now()
				if !at.Before(warmEnd) {
					win.open(ctx, at)
				}
				grants[ci] = append(grants[ci], at)
				if err := release(ctx); err != nil {
					cancel(fmt.Errorf("client %d release: %w", ci, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	<-win.done
	windowStart, end := win.start, win.end
	if err := context.Cause(ctx); err != nil {
		return loadResult{}, err
	}
	res := loadResult{elapsed: end.Sub(windowStart), perClient: make([]int, len(clients))}
	for ci, ts := range grants {
		for _, at := range ts {
			if !at.Before(windowStart) && at.Before(end) {
				res.perClient[ci]++
			}
		}
		res.ops += res.perClient[ci]
	}
	return res, nil
}

// sortedLatencies pools the latencies of results and sorts them.
func sortedLatencies(rs []loadResult) []time.Duration {
	var all []time.Duration
	for _, r := range rs {
		all = append(all, r.lat...)
	}
	slices.Sort(all)
	return all
}

// window is the measured window of a load scenario: it opens at the first
// event after the warm-up (a grant or a hand-over, which it counts, so that
// it holds at least one however slow the system) and closes at least its
// duration after the CPU clocks were read for it, at the second reading.
// The event's goroutine reads the clocks (open), not the window's
// controller: a controller scheduled late on a loaded machine would read
// them long after the event and close the window at once, metering no CPU
// for the operations counted (issue 21, "lockd figure 0").
type window struct {
	done       chan struct{}  // closed when the window ended (or the run did)
	first      chan time.Time // the opening event's time, sent once the clocks were read
	opening    atomic.Bool
	start, end time.Time // valid once done is closed
}

// open is called by a load's goroutine at each event after the warm-up,
// at being its time: the first call reads the CPU clocks (windowOpened)
// and opens the window at at.
func (w *window) open(ctx context.Context, at time.Time) {
	if w.opening.Load() || w.opening.Swap(true) { // a load only: every later event skips the write
		return
	}
	windowOpened(ctx)
	w.first <- at // buffered: never blocks
}

// startWindow runs a window's controller: it waits for the window to open
// (open), ends it dur after that with wcancel, and fails the run through
// cancel if no event (what) comes within firstGrantTimeout. It exits when
// the window ends or ctx does.
func startWindow(ctx context.Context, cancel context.CancelCauseFunc, wcancel context.CancelFunc, dur time.Duration,
	what string) *window {
	w := &window{done: make(chan struct{}), first: make(chan time.Time, 1)}
	go func() {
		defer close(w.done)
		defer wcancel()
		noGrant := time.NewTimer(firstGrantTimeout)
		defer noGrant.Stop()
		select {
		case w.start = <-w.first:
		case <-noGrant.C:
			cancel(fmt.Errorf("no %s within %v", what, firstGrantTimeout))
			return
		case <-ctx.Done():
			return
		}
		end := time.NewTimer(dur) // from now: at least dur after the first reading
		defer end.Stop()
		select {
		case <-end.C:
			windowClosed(ctx)
			w.end = time.Now()
		case <-ctx.Done():
		}
	}()
	return w
}
