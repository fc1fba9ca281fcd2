package server

import "time"

// SetMaxWait shortens the per-call maximum wait of an Acquire (MaxWait) on
// a running server, so a test can cross it without waiting 10 minutes.
func SetMaxWait(s *Server, d time.Duration) { s.maxWait.Store(int64(d)) }
