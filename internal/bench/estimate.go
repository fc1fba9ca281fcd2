package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"lock.dev/lockd/client"
)

// The estimate scenario (issue 27, C2 #ct2-wait-estimate): how far
// Inspect's wait estimate is from the wait that follows. Not in the
// default run (Optional): name it with --scenarios estimate.
const scEstimate = "estimate"

// Optional are the scenarios run only when named, after the others.
var Optional = []string{scEstimate, scScale}

// The estimate rows.
const (
	MetricEstimateErrP50 = "|estimate - actual| p50 ms"
	MetricEstimateErrP90 = "|estimate - actual| p90 ms"
	MetricEstimateBias   = "estimate - actual p50 ms"
	MetricEstimateWait50 = "actual wait p50 ms"
	MetricEstimateShown  = "waits with an estimate %"
)

// The estimate scenario's load: c clients on one key, each holding it for
// a uniformly drawn estimateHoldMin … estimateHoldMax, polling Inspect
// every estimatePoll while it waits until the answer lists it.
const (
	estimateHoldMin = 10 * time.Millisecond
	estimateHoldMax = 50 * time.Millisecond
	estimatePoll    = 5 * time.Millisecond
)

// estimateSample is one wait: the estimate of the first Inspect answer that
// listed the waiter, and the time from that answer to the grant.
type estimateSample struct {
	est, actual time.Duration
	shown       bool // the answer carried an estimate for the waiter
}

// estimate runs, for each round, the clients of the first contended
// concurrency against lockd's server (the `lockd serve` child in the own
// processes layout; the clients run in this process, as the death
// scenario's do: the figure is an error in milliseconds, not a cost) on a
// key of its own, and reports |estimate − actual| over the waits that had
// an estimate, after a warm-up that gives the server holds to learn from.
func (r *runner) estimate(ctx context.Context) ([]Row, error) {
	if r.bed.lockd == nil {
		return nil, errors.New("estimate: no lockd client")
	}
	c := r.cfg.ContendedConcurrency[0]
	var all []estimateSample
	for round := 1; round <= r.cfg.Rounds; round++ {
		key := fmt.Sprintf("estimate/%s/r%d", r.bed.run, round)
		ss, err := estimateRound(ctx, r.bed.lockd, key, c, r.cfg.Duration)
		if err != nil {
			return nil, fmt.Errorf("estimate round %d: %w", round, err)
		}
		all = append(all, ss...)
		r.progressf("%-22s round %d/%d  %-14s %d waits", fmt.Sprintf("estimate c=%d", c), round, r.cfg.Rounds, sysLockd, len(ss))
	}
	var errs, signed, actual []time.Duration
	for _, s := range all {
		actual = append(actual, s.actual)
		if s.shown {
			errs = append(errs, (s.est - s.actual).Abs())
			signed = append(signed, s.est-s.actual)
		}
	}
	slices.Sort(errs)
	slices.Sort(signed)
	slices.Sort(actual)
	shown := Value(0)
	if len(all) > 0 {
		shown = Value(100 * float64(len(errs)) / float64(len(all)))
	}
	note := fmt.Sprintf("estimate: %d clients on one key, holds uniform %v–%v, %d waits (%d with an estimate); the estimate is "+
		"Inspect's for the waiter in the first answer that lists it, the actual wait from that answer to the grant; "+
		"the clients run in the bench process, the server in its own", c, estimateHoldMin, estimateHoldMax, len(all), len(errs))
	return []Row{
		{Scenario: scEstimate, Concurrency: c, Metric: MetricEstimateErrP50, Lockd: percentile(errs, 50), Note: note},
		{Scenario: scEstimate, Concurrency: c, Metric: MetricEstimateErrP90, Lockd: percentile(errs, 90), Note: note},
		{Scenario: scEstimate, Concurrency: c, Metric: MetricEstimateBias, Lockd: percentile(signed, 50), Note: note},
		{Scenario: scEstimate, Concurrency: c, Metric: MetricEstimateWait50, Lockd: percentile(actual, 50), Note: note},
		{Scenario: scEstimate, Concurrency: c, Metric: MetricEstimateShown, Lockd: shown, Note: note},
	}, nil
}

// estimateRound runs c clients on key for warm-up + dur and returns the
// waits that began after the warm-up.
func estimateRound(ctx context.Context, lc *client.Client, key string, c int, dur time.Duration) ([]estimateSample, error) {
	warm := min(dur/5, time.Second)
	start := time.Now()
	measureFrom, end := start.Add(warm), start.Add(warm+dur)
	var (
		mu      sync.Mutex
		samples []estimateSample
	)
	err := parallel(ctx, c, c, func(ctx context.Context, i int) error {
		s, err := lc.NewSession(ctx)
		if err != nil {
			return err
		}
		defer s.Close(context.Background())
		rng := rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))
		for time.Now().Before(end) {
			sample, l, err := waitWithEstimate(ctx, lc, s, key)
			if err != nil {
				return err
			}
			if sample != nil && !sample.at.Before(measureFrom) {
				mu.Lock()
				samples = append(samples, sample.estimateSample)
				mu.Unlock()
			}
			hold := estimateHoldMin + time.Duration(rng.Int64N(int64(estimateHoldMax-estimateHoldMin)))
			select { // the hold: the load's input
			case <-time.After(hold):
			case <-ctx.Done():
				return ctx.Err()
			}
			if err := l.Release(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	return samples, err
}

type timedSample struct {
	estimateSample
	at time.Time // when the Inspect answer came
}

// waitWithEstimate acquires key for s, polling Inspect while it waits; the
// sample is nil when no answer listed s before the grant.
func waitWithEstimate(ctx context.Context, lc *client.Client, s *client.Session, key string) (*timedSample, *client.Lock, error) {
	pctx, stop := context.WithCancel(ctx)
	seen := make(chan *timedSample, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // ends when stop cancels pctx (at the grant) or it saw s
		defer wg.Done()
		defer close(seen)
		t := time.NewTicker(estimatePoll)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
			info, err := lc.Inspect(pctx, key)
			at := time.Now()
			if err != nil {
				continue
			}
			for _, w := range info.Waiters {
				if w != s.ID() {
					continue
				}
				ts := &timedSample{at: at}
				for _, e := range info.WaitEstimates {
					if e.Session == s.ID() {
						ts.est, ts.shown = e.Wait, true
					}
				}
				seen <- ts
				return
			}
		}
	}()
	l, err := s.Acquire(ctx, key)
	granted := time.Now()
	stop()
	wg.Wait()
	if err != nil {
		return nil, nil, err
	}
	ts := <-seen
	if ts != nil {
		ts.actual = granted.Sub(ts.at)
	}
	return ts, l, nil
}
