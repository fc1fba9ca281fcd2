package server

import "time"

// SetMaxWait shortens the per-call maximum wait of an Acquire (MaxWait) on
// a running server, so a test can cross it without waiting 10 minutes.
func SetMaxWait(s *Server, d time.Duration) { s.maxWait.Store(int64(d)) }

// SetAfterAcquireTrack makes every granted Acquire call f with its key
// after the grant is recorded as held and before the reply is sent; nil
// removes it.
func SetAfterAcquireTrack(s *Server, f func(key string)) {
	if f == nil {
		s.afterAcquireTrack.Store(nil)
		return
	}
	s.afterAcquireTrack.Store(&f)
}
