package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"lock.dev/lockd/client"
)

// The acquire-all scenario (issue 26 §2): each of c clients takes a set of
// acquireAllKeys keys of its own (distinct keys: nobody waits) and releases
// them, in a loop, on lockd in two ways through the Go SDK:
//
//   - lockd-all: Session.AcquireAll of the set (one call; on the server one
//     commit for a set of free keys, C2 #ct2-acquire-all), then
//     client.ReleaseAll;
//   - lockd-sorted: Session.Acquire of each key in ascending order (one call
//     and one commit per key), then Release of each.
//
// The releases are the same K calls in both. Figures: sets/s (take +
// release) and the take's p50/p99 (from the first call until the set is
// held).

const (
	scAcquireAll  = "acquire-all"
	sysLockdAll   = "lockd-all"
	sysLockdSortd = "lockd-sorted"
	// acquireAllKeys is K, the keys of one set.
	acquireAllKeys = 4
)

// MetricSetsPerSec and the take latencies of the acquire-all rows.
const (
	MetricSetsPerSec = "sets/s"
	MetricTakeP50    = "take p50 ms"
	MetricTakeP99    = "take p99 ms"
)

var acquireAllNote = "acquire-all: c clients, each with keys of its own, loop: take a set of " + strconv.Itoa(acquireAllKeys) +
	" keys, release them; lockd = Session.AcquireAll (one commit for a set of free keys), baseline lockd-sorted = Session.Acquire " +
	"of each key in ascending order; both release with one Release per key; take = from the first call until the whole set is held"

// lockdSetSystem is lockd taking sets of keys: a locker's acquire(key)
// takes key/0 .. key/K-1.
type lockdSetSystem struct {
	base *lockdSystem
	all  bool // AcquireAll; else one Acquire per key, in order
}

func (s *lockdSetSystem) name() string {
	if s.all {
		return sysLockdAll
	}
	return sysLockdSortd
}

func (s *lockdSetSystem) open(ctx context.Context) (locker, error) {
	l, err := s.base.open(ctx)
	if err != nil {
		return nil, err
	}
	return lockdSetLocker{l.(lockdLocker).s, s.all}, nil
}

type lockdSetLocker struct {
	s   *client.Session
	all bool
}

// setKeys are the keys of the set named by key, in ascending order.
func setKeys(key string) []string {
	keys := make([]string, acquireAllKeys)
	for i := range keys {
		keys[i] = key + "/" + strconv.Itoa(i)
	}
	slices.Sort(keys)
	return keys
}

func (l lockdSetLocker) acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	keys := setKeys(key)
	if l.all {
		ls, err := l.s.AcquireAll(ctx, keys)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return client.ReleaseAll(ctx, ls) }, nil
	}
	ls := make([]*client.Lock, 0, len(keys))
	for _, k := range keys {
		lk, err := l.s.Acquire(ctx, k)
		if err != nil {
			_ = client.ReleaseAll(ctx, ls)
			return nil, err
		}
		ls = append(ls, lk)
	}
	return func(ctx context.Context) error { return client.ReleaseAll(ctx, ls) }, nil
}

func (l lockdSetLocker) close(ctx context.Context) error { return l.s.Close(ctx) }

// acquireAll measures lockd-all against lockd-sorted at each concurrency.
func (r *runner) acquireAll(ctx context.Context) ([]Row, error) {
	base := r.bed.systems[0].(*lockdSystem)
	systems := []system{&lockdSetSystem{base: base, all: true}, &lockdSetSystem{base: base}}
	var rows []Row
	for _, c := range r.cfg.AcquireAllConcurrency {
		res, err := r.rounds(ctx, fmt.Sprintf("acquire-all c=%d K=%d", c, acquireAllKeys), systemEntries(systems,
			func(ctx context.Context, sys system, round int) (loadResult, string, error) {
				tag := fmt.Sprintf("acquire-all-c%d-r%d", c, round)
				lr, err := r.cell(ctx, scAcquireAll, sys, c, tag, func(ctx context.Context) (loadResult, error) {
					return measure(ctx, sys, c, r.cfg.Duration, tag, takeLoad)
				})
				lat := sortedLatencies([]loadResult{lr})
				return lr, fmt.Sprintf("%s sets/s  take p50 %s ms  p99 %s ms", lr.rate(), percentile(lat, 50), percentile(lat, 99)), err
			}))
		if err != nil {
			return rows, err
		}
		all, sorted := res[sysLockdAll], res[sysLockdSortd]
		ar, sr := rates(all), rates(sorted)
		sets := compare(scAcquireAll, c, MetricSetsPerSec, sysLockdSortd, median(ar), median(sr))
		sets.LockdRounds, sets.RawRounds = ar, sr
		al, sl := sortedLatencies(all), sortedLatencies(sorted)
		p50 := compare(scAcquireAll, c, MetricTakeP50, sysLockdSortd, percentile(al, 50), percentile(sl, 50))
		p99 := compare(scAcquireAll, c, MetricTakeP99, sysLockdSortd, percentile(al, 99), percentile(sl, 99))
		for _, row := range []*Row{&sets, &p50, &p99} {
			row.Note = acquireAllNote
		}
		rows = append(rows, sets, p50, p99)
	}
	return rows, nil
}
