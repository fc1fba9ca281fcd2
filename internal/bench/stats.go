package bench

import (
	"math"
	"slices"
	"time"
)

// median returns the median of vs (the mean of the middle two for an even
// count); NaN when vs is empty. +Inf sorts last.
func median(vs []Value) Value {
	if len(vs) == 0 {
		return Value(math.NaN())
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	mid := len(s) / 2
	if len(s)%2 == 1 {
		return s[mid]
	}
	if math.IsInf(float64(s[mid]), 1) {
		return s[mid]
	}
	return (s[mid-1] + s[mid]) / 2
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method, in milliseconds; NaN when empty.
func percentile(sorted []time.Duration, p float64) Value {
	if len(sorted) == 0 {
		return Value(math.NaN())
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return ms(sorted[rank-1])
}

// ms converts d to milliseconds.
func ms(d time.Duration) Value { return Value(float64(d) / float64(time.Millisecond)) }

// fairness is max/min of the acquisitions per client: 1 is perfectly fair,
// +Inf means some client never got the lock. NaN without clients.
func fairness(perClient []int) Value {
	if len(perClient) == 0 {
		return Value(math.NaN())
	}
	lo, hi := slices.Min(perClient), slices.Max(perClient)
	if lo == 0 {
		return Value(math.Inf(1))
	}
	return Value(float64(hi) / float64(lo))
}

// ratio returns a / b, or nil when either is not finite or b is 0.
func ratio(a, b Value) *Value {
	fa, fb := float64(a), float64(b)
	if math.IsNaN(fa) || math.IsNaN(fb) || math.IsInf(fa, 0) || math.IsInf(fb, 0) || fb == 0 {
		return nil
	}
	r := Value(fa / fb)
	return &r
}
