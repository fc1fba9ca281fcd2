package prefixstats

import (
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Buckets of the histograms (C4 #ct4-template-stats).
var (
	// SecondsBuckets are lockd_lock_wait_seconds' and
	// lockd_lock_hold_seconds': 1 ms × 4ⁿ, n = 0 … 10.
	SecondsBuckets = prometheus.ExponentialBuckets(0.001, 4, 11)
	// QueueBuckets are lockd_lock_queue_length's: 0, 1, 2, 4 … 256.
	QueueBuckets = append([]float64{0}, prometheus.ExponentialBuckets(1, 2, 9)...)
)

// SeriesPerTemplate is the most series one template value has: each
// histogram's buckets, +Inf, _sum and _count.
var SeriesPerTemplate = 2*(len(SecondsBuckets)+3) + len(QueueBuckets) + 3

// MaxSeries is the most series the statistics add (C4 #ct4-template-stats).
var MaxSeries = (MaxTemplates + 1) * SeriesPerTemplate

// Label is the metrics' one label.
const Label = "template"

// series are one template's observers, created at its first observation.
type series struct {
	wait, hold, queue prometheus.Observer
}

// Stats are the per-template statistics of one server. A nil *Stats is
// valid: Template returns -1 and nothing is recorded. Safe for concurrent
// use.
type Stats struct {
	patterns []pattern // declared; empty: the first-segment default
	segments bool      // without patterns: the first-segment default (false: every key is Other's)
	wait     *prometheus.HistogramVec
	hold     *prometheus.HistogramVec
	queue    *prometheus.HistogramVec

	// names[i] is the label value of template i (0 ≤ i ≤ MaxTemplates);
	// index other is Other. Declared names are set by New; the
	// default's by addSegment under mu, before segIdx publishes them.
	names  [MaxTemplates + 1]string
	other  int
	slots  [MaxTemplates + 1]atomic.Pointer[series]
	mu     sync.Mutex                     // orders the default's new segments
	segIdx atomic.Pointer[map[string]int] // the default: first segment → index (copied on write)
}

// New validates templates (C5 lock.server.stats.templates; empty: the
// first-segment default when segments, else every key under Other: the
// server passes false under an access policy, C4 #ct4-template-stats) and
// registers the three histograms on reg (nil: not registered anywhere).
func New(reg prometheus.Registerer, templates []string, segments bool) (*Stats, error) {
	ps, err := compile(templates)
	if err != nil {
		return nil, err
	}
	s := &Stats{
		patterns: ps,
		segments: segments,
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "lockd", Name: "lock_wait_seconds",
			Help:    "Time from an Acquire's arrival to its grant, by key template.",
			Buckets: SecondsBuckets}, []string{Label}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "lockd", Name: "lock_hold_seconds",
			Help:    "Time from a grant to its Release through this lockd, by key template.",
			Buckets: SecondsBuckets}, []string{Label}),
		queue: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "lockd", Name: "lock_queue_length",
			Help:    "Acquires of this lockd already waiting for the key when a waiting Acquire joined, by key template.",
			Buckets: QueueBuckets}, []string{Label}),
	}
	for i, p := range ps {
		s.names[i] = p.text
	}
	s.other = MaxTemplates
	s.names[s.other] = Other
	empty := map[string]int{}
	s.segIdx.Store(&empty)
	if reg != nil {
		for _, c := range []prometheus.Collector{s.wait, s.hold, s.queue} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("prefixstats: %w", err)
			}
		}
	}
	return s, nil
}

// Template returns the index of key's template: the first declared template
// key matches, or by default the key's first path segment while fewer than
// MaxTemplates are known; else Other's. It allocates nothing, except once
// for each new first segment of the default.
func (s *Stats) Template(key string) int {
	if s == nil {
		return -1
	}
	if len(s.patterns) > 0 {
		for i, p := range s.patterns {
			if p.matches(key) {
				return i
			}
		}
		return s.other
	}
	slash := strings.IndexByte(key, '/')
	if slash <= 0 || !s.segments {
		return s.other
	}
	seg := key[:slash]
	if i, ok := (*s.segIdx.Load())[seg]; ok {
		return i
	}
	return s.addSegment(seg)
}

// addSegment gives seg the next index of the default, or Other's when
// MaxTemplates are taken.
func (s *Stats) addSegment(seg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := *s.segIdx.Load()
	if i, ok := cur[seg]; ok {
		return i
	}
	if len(cur) >= MaxTemplates {
		return s.other
	}
	i := len(cur)
	s.names[i] = seg + "/" + Any
	next := make(map[string]int, len(cur)+1)
	maps.Copy(next, cur)
	next[strings.Clone(seg)] = i
	s.segIdx.Store(&next)
	return i
}

// Name is the label value of template index i ("" for an index Template
// did not return).
func (s *Stats) Name(i int) string {
	if s == nil || i < 0 || i > MaxTemplates {
		return ""
	}
	// A default's name is written before the map that hands out its
	// index is published (addSegment), and never again.
	return s.names[i]
}

// observers returns template i's series, created at the first call.
func (s *Stats) observers(i int) *series {
	if sr := s.slots[i].Load(); sr != nil {
		return sr
	}
	name := s.Name(i)
	sr := &series{wait: s.wait.WithLabelValues(name), hold: s.hold.WithLabelValues(name), queue: s.queue.WithLabelValues(name)}
	s.slots[i].CompareAndSwap(nil, sr)
	return s.slots[i].Load()
}

// valid reports whether i is an index Template can return.
func (s *Stats) valid(i int) bool { return s != nil && i >= 0 && i <= MaxTemplates }

// Waited observes an Acquire's time from arrival to grant.
func (s *Stats) Waited(i int, d time.Duration) {
	if s.valid(i) {
		s.observers(i).wait.Observe(d.Seconds())
	}
}

// Held observes a grant's time from its answer to its Release.
func (s *Stats) Held(i int, d time.Duration) {
	if s.valid(i) {
		s.observers(i).hold.Observe(d.Seconds())
	}
}

// Queued observes the number of this lockd's Acquires already waiting for
// a key when another joined them.
func (s *Stats) Queued(i, n int) {
	if s.valid(i) {
		s.observers(i).queue.Observe(float64(n))
	}
}
