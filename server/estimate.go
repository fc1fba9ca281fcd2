package server

import (
	"time"

	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/server/internal/estimate"
	"lock.dev/lockd/store"
)

// withEstimates adds to out, Inspect's answer for the held key info, each
// waiter's wait estimate (C2 #ct2-wait-estimate): none when the key has no
// waiters, no hold of the key or its template was observed here, or the
// statistics are off.
func (s service) withEstimates(out *lockdv1.LockInfo, info store.LockInfo) *lockdv1.LockInfo {
	if len(info.Waiters) == 0 || s.est == nil {
		return out
	}
	typ, gap, ok := s.est.Typical(info.Key, s.stats.Template(info.Key))
	if !ok {
		return out
	}
	now := time.Now()
	holders := info.Holders
	if len(holders) == 0 {
		holders = []store.HolderInfo{{Session: info.Session, Token: info.Token, AcquiredAt: info.AcquiredAt}}
	}
	elapsed := make([]time.Duration, 0, len(holders))
	for _, h := range holders {
		if d, ok := s.sess.HeldFor(h.Session, info.Key); ok { // this lockd's own clock
			elapsed = append(elapsed, d)
		} else if !h.AcquiredAt.IsZero() { // the backend's clock against ours
			elapsed = append(elapsed, max(now.Sub(h.AcquiredAt), 0))
		}
	}
	n := info.Limit
	if info.RW {
		n = 1
	}
	for i, d := range estimate.Waits(typ, gap, elapsed, n, len(info.Waiters)) {
		out.WaitEstimates = append(out.WaitEstimates, &lockdv1.WaitEstimate{
			SessionId: string(info.Waiters[i]), Position: uint32(i + 1), EstimateMs: d.Round(time.Millisecond).Milliseconds()})
	}
	return out
}

// grantObserved feeds a grant this lockd answered, after waited, to the
// per-template statistics, the hot keys and the wait estimates.
func (s service) grantObserved(key string, waited time.Duration) {
	tmpl := s.stats.Template(key)
	s.stats.Waited(tmpl, waited)
	s.hot.Waited(key, waited)
	s.est.Granted(key, tmpl, waited)
}
