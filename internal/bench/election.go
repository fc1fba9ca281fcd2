package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The election scenario (issue #15 §2): c candidates campaign in a loop for
// one election; each leader resigns as soon as every other candidate is
// campaigning, so that every resignation hands over to a waiting candidate,
// and campaigns again only after another candidate was granted, so that
// every leadership is a hand-over; one observer follows the election. Per
// system:
//
//   - hand-overs/s: leaderships that followed a resignation in the window;
//   - hand-over latency: from the start of the leader's Resign until the
//     Campaign of the next leader returned;
//   - observed latency: from the same start until the observer reported the
//     next leader;
//   - leaders observed: the share of the window's leaders the observer
//     reported (an observer may skip a short leadership).
//
// Systems take part through two small interfaces, elector and candidate:
// one method to open a candidate, one to campaign, one to observe. A
// semaphore row is the same shape: an interface with the system's acquire
// of a slot, a load, and a row function like election below.

// elector is a system with leader election.
type elector interface {
	name() string
	// candidate opens a candidate of its own: a session, lease or
	// sessions row.
	candidate(ctx context.Context) (candidate, error)
	// observe follows the election until ctx ends and calls seen with the
	// id of every leader it reports (the same ids campaign returns). It
	// returns nil when ctx ends, else why it could not go on.
	observe(ctx context.Context, election string, seen func(id uint64)) error
}

// candidate is one client of an elector.
type candidate interface {
	// campaign waits until this candidate leads election, publishing
	// value, and returns an id that tells this leadership from every
	// other of the election (a token, a create revision) and the function
	// that resigns it.
	campaign(ctx context.Context, election string, value []byte) (id uint64, resign func(context.Context) error, err error)
	close(ctx context.Context) error
}

// scElection is the election scenario; sysEtcdElection its etcd recipe.
const (
	scElection      = "election"
	sysEtcdElection = "etcd-election"
)

// observeGrace bounds the wait, after the window, for the observer to
// report the window's last leader.
const observeGrace = 5 * time.Second

// electionNote explains the election rows.
const electionNote = "election: c candidates campaign in a loop; a leader resigns once every other candidate is campaigning, and campaigns again " +
	"only after another candidate was granted (every leadership is a hand-over to a waiting candidate); " +
	"hand-over = Resign start -> next leader's Campaign returns; observed = Resign start -> the observer reports the next leader; " +
	"lockd = Session.Campaign / Leadership.Resign / Client.Observe; etcd-election (primary on etcd) = concurrency.Election Campaign / Resign / Observe; " +
	"etcd-txn = its lock with the value, observed by Get + watch of the key; pg-raw = its lock on a leaders table with a value column, " +
	"observed by polling the row every 2-10 ms (PostgreSQL has no election library to compare with)"

// electionResyncNote explains concurrency.Election's hand-over figures.
const electionResyncNote = "x etcd-election: a waiting concurrency.Election candidate watches its predecessor's key from the revision of " +
	"its last read, a past revision, so etcd serves that watcher from its unsynced list every 100 ms (watchResyncPeriod), as for " +
	"concurrency.Mutex; its Observe reads the first key again after each delete and so skips leaders that resigned meanwhile"

func (r *runner) election(ctx context.Context) ([]Row, error) {
	var rows []Row
	for _, c := range r.cfg.ElectionConcurrency {
		var entries []entry
		for _, el := range r.bed.electors {
			entries = append(entries, entry{el.name(), func(ctx context.Context, round int) (loadResult, string, error) {
				tag := fmt.Sprintf("election-c%d-r%d", c, round)
				lr, err := r.cell(ctx, scElection, el, c, tag, func(ctx context.Context) (loadResult, error) {
					return measureElection(ctx, el, c, r.cfg.Duration, tag)
				})
				lat, obs := sortedLatencies([]loadResult{lr}), sortedObserved([]loadResult{lr})
				return lr, fmt.Sprintf("%s hand-overs/s  p50 %s ms  observed p50 %s ms  %s%% observed",
					lr.rate(), percentile(lat, 50), percentile(obs, 50), lr.observedPct()), err
			}})
		}
		res, err := r.rounds(ctx, fmt.Sprintf("election c=%d", c), entries)
		if err != nil {
			return rows, err
		}
		lockd := res[sysLockd]
		for _, el := range r.bed.electors[1:] {
			name := el.name()
			raw := res[name]
			lr, rr := rates(lockd), rates(raw)
			ho := compare(scElection, c, MetricHandoversPerSec, name, median(lr), median(rr))
			ho.LockdRounds, ho.RawRounds = lr, rr
			rows = append(rows, ho)
			for _, p := range []struct {
				metric string
				pct    float64
				lat    func([]loadResult) []time.Duration
			}{
				{MetricHandoverP50, 50, sortedLatencies},
				{MetricHandoverP99, 99, sortedLatencies},
				{MetricObservedP50, 50, sortedObserved},
				{MetricObservedP99, 99, sortedObserved},
			} {
				rows = append(rows, compare(scElection, c, p.metric, name, percentile(p.lat(lockd), p.pct), percentile(p.lat(raw), p.pct)))
			}
			lo, ro := observedPcts(lockd), observedPcts(raw)
			seen := compare(scElection, c, MetricObservedPct, name, median(lo), median(ro))
			seen.LockdRounds, seen.RawRounds = lo, ro
			rows = append(rows, seen)
		}
		var names []string
		for _, el := range r.bed.electors {
			names = append(names, el.name())
		}
		rows = append(rows, cpuRows(scElection, c, res, names, "", 0)...)
	}
	for i := range rows {
		if rows[i].Note == cpuNote {
			continue
		}
		rows[i].Note = electionNote
		if rows[i].Baseline == sysEtcdElection {
			rows[i].Note = electionResyncNote
		}
	}
	return rows, nil
}

func sortedObserved(rs []loadResult) []time.Duration {
	var all []time.Duration
	for _, r := range rs {
		all = append(all, r.obsLat...)
	}
	slices.Sort(all)
	return all
}

func observedPcts(rs []loadResult) []Value {
	var vs []Value
	for _, r := range rs {
		vs = append(vs, r.observedPct())
	}
	return vs
}

// openClients opens c clients with open, at most setupWidth at a time, and
// returns them with the function that closes them all.
func openClients[T interface{ close(context.Context) error }](ctx context.Context, c int, open func(context.Context) (T, error)) ([]T, func(), error) {
	clients := make([]T, c)
	opened := make([]bool, c)
	err := parallel(ctx, c, setupWidth, func(ctx context.Context, i int) error {
		cl, err := open(ctx)
		if err == nil {
			clients[i], opened[i] = cl, true
		}
		return err
	})
	closeAll := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = parallel(cctx, c, setupWidth, func(ctx context.Context, i int) error {
			if opened[i] {
				return clients[i].close(ctx)
			}
			return nil
		})
	}
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return clients, closeAll, nil
}

// measureElection opens c candidates of el, runs the election load on them
// with an observer, closes them and returns the result.
func measureElection(ctx context.Context, el elector, c int, dur time.Duration, tag string) (loadResult, error) {
	return measureClients(ctx, el, c, "candidates", el.candidate, func(ctx context.Context, cands []candidate) (loadResult, error) {
		return electionLoad(ctx, el, cands, warmupFor(dur), dur, tag)
	})
}

// measureClients prepares sys (a preparer), opens c clients of it with
// open (what names them in errors), runs load on them under sys's
// profiling label, closes them and returns the result.
func measureClients[T interface{ close(context.Context) error }](ctx context.Context, sys interface{ name() string }, c int, what string,
	open func(context.Context) (T, error), load func(context.Context, []T) (loadResult, error)) (res loadResult, err error) {
	name := sys.name()
	if p, ok := sys.(preparer); ok {
		done, err := p.prepare(ctx, c)
		if err != nil {
			return loadResult{}, err
		}
		defer done() // after the clients closed
	}
	pprof.Do(ctx, pprof.Labels(labelSystem, name), func(ctx context.Context) {
		clients, closeAll, oerr := openClients(ctx, c, open)
		if oerr != nil {
			err = fmt.Errorf("%s: open %d %s: %w", name, c, what, oerr)
			return
		}
		defer closeAll()
		if res, err = load(ctx, clients); err != nil {
			err = fmt.Errorf("%s: %w", name, err)
		}
	})
	return res, err
}

// leadership is one won campaign of the election load.
type leadership struct {
	id       uint64
	granted  time.Time // Campaign returned
	resigned time.Time // Resign started
}

// campaigning paces the candidates so that every leadership is a
// hand-over to another candidate that was waiting: a leader resigns once
// every other candidate is inside campaign, and a candidate that resigned
// campaigns again only after someone else was granted (else an election
// without a queue, such as a polled row, would often re-elect the one who
// just resigned). It also counts the leaders: from Campaign's return to the
// start of Resign, at most one.
type campaigning struct {
	mu      sync.Mutex
	cond    *sync.Cond
	n       int // candidates inside campaign
	leaders int
	grants  int // leaderships so far
	ended   bool
}

// granted counts a leadership and returns its number (1, 2, …).
func (g *campaigning) granted() int {
	g.mu.Lock()
	g.grants++
	n := g.grants
	g.mu.Unlock()
	g.cond.Broadcast()
	return n
}

// awaitGrant returns when leadership number n+1 was granted, or the load
// ended.
func (g *campaigning) awaitGrant(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.grants <= n && !g.ended {
		g.cond.Wait()
	}
}

// lead counts a leader in (d = 1) or out (d = -1); false when the
// election now has two leaders at once.
func (g *campaigning) lead(d int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.leaders += d
	return g.leaders <= 1
}

func newCampaigning() *campaigning {
	g := &campaigning{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *campaigning) add(d int) {
	g.mu.Lock()
	g.n += d
	g.mu.Unlock()
	g.cond.Broadcast()
}

// await returns when n candidates campaign or the load ended.
func (g *campaigning) await(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.n < n && !g.ended {
		g.cond.Wait()
	}
}

func (g *campaigning) end() {
	g.mu.Lock()
	g.ended = true
	g.mu.Unlock()
	g.cond.Broadcast()
}

// sightings records when the observer first reported each leader.
type sightings struct {
	mu   sync.Mutex
	at   map[uint64]time.Time
	high uint64
}

func (s *sightings) seen(id uint64) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.at[id]; !ok {
		s.at[id] = now
	}
	s.high = max(s.high, id)
}

func (s *sightings) highest() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.high
}

// electionLoad runs the election on cands with one observer of el. The
// window opens at the first hand-over after warm (a leadership that followed
// a resignation) and lasts dur; waiting campaigns are then cancelled.
func electionLoad(ctx context.Context, el elector, cands []candidate, warm, dur time.Duration, tag string) (loadResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	election := tag + "/leader"

	// The observer, from before the first campaign until the window's last
	// leader was reported (or observeGrace passed).
	obs := &sightings{at: map[uint64]time.Time{}}
	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	obsDone := make(chan error, 1)
	go func() { obsDone <- el.observe(octx, election, obs.seen) }() // exits when octx ends

	wctx, wcancel := context.WithCancel(ctx) // ends the campaigning after the window
	defer wcancel()
	gate := newCampaigning()
	stopGate := context.AfterFunc(wctx, gate.end)
	defer stopGate()

	start := time.Now()
	warmEnd := start.Add(warm)
	win := startWindow(ctx, cancel, wcancel, dur, "hand-over")

	led := make([][]leadership, len(cands))
	var wg sync.WaitGroup
	for ci, cand := range cands {
		wg.Add(1)
		go func() { // exits when the window ends or on the first error
			defer wg.Done()
			value := []byte("candidate-" + strconv.Itoa(ci))
			for wctx.Err() == nil {
				gate.add(1)
				id, resign, err := cand.campaign(wctx, election, value)
				gate.add(-1)
				if err != nil {
					if wctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
						// The server may report the end a moment before
						// this process's context shows it.
						select {
						case <-wctx.Done():
						case <-time.After(time.Second):
						}
					}
					if wctx.Err() != nil && ctx.Err() == nil {
						return // the window ended while campaigning
					}
					cancel(fmt.Errorf("candidate %d campaign: %w", ci, err))
					return
				}
				at := time.Now()
				if !gate.lead(1) {
					cancel(fmt.Errorf("two leaders at once: candidate %d won (id %d) while another led", ci, id))
					return
				}
				nth := gate.granted()
				if nth > 1 && !at.Before(warmEnd) {
					win.open(ctx, at)
				}
				gate.await(len(cands) - 1)
				gate.lead(-1)
				led[ci] = append(led[ci], leadership{id: id, granted: at, resigned: time.Now()})
				if err := resign(ctx); err != nil {
					cancel(fmt.Errorf("candidate %d resign: %w", ci, err))
					return
				}
				gate.awaitGrant(nth)
			}
		}()
	}
	wg.Wait()
	<-win.done
	windowStart, end := win.start, win.end
	if err := context.Cause(ctx); err != nil {
		return loadResult{}, err
	}
	all := slices.Concat(led...)
	slices.SortFunc(all, func(a, b leadership) int { return a.granted.Compare(b.granted) })
	for i := 1; i < len(all); i++ { // also after gate.lead said so: leaders follow each other
		if !all[i].granted.After(all[i-1].resigned) {
			return loadResult{}, fmt.Errorf("two leaders at once: %d granted at +%v, before %d resigned at +%v",
				all[i].id, all[i].granted.Sub(start), all[i-1].id, all[i-1].resigned.Sub(start))
		}
	}
	var window []int // indexes into all of the window's hand-overs
	for i := 1; i < len(all); i++ {
		if !all[i].granted.Before(windowStart) && all[i].granted.Before(end) {
			window = append(window, i)
		}
	}
	// Give the observer until it reported the window's last leader.
	if len(window) > 0 {
		last := all[window[len(window)-1]].id
		for deadline := time.Now().Add(observeGrace); obs.highest() < last && time.Now().Before(deadline); {
			if err := sleep(ctx, time.Millisecond); err != nil {
				return loadResult{}, err
			}
		}
	}
	ocancel()
	if err := <-obsDone; err != nil && ctx.Err() == nil {
		return loadResult{}, fmt.Errorf("observe: %w", err)
	}
	res := loadResult{elapsed: end.Sub(windowStart), ops: len(window), perClient: make([]int, len(cands))}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for _, i := range window {
		prev, cur := all[i-1], all[i]
		res.lat = append(res.lat, cur.granted.Sub(prev.resigned))
		if at, ok := obs.at[cur.id]; ok {
			if at.Before(prev.resigned) {
				return loadResult{}, fmt.Errorf("the observer reported leader %d before %d resigned", cur.id, prev.id)
			}
			res.obsLat = append(res.obsLat, at.Sub(prev.resigned))
		}
	}
	return res, nil
}
