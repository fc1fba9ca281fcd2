package server

import (
	"context"
	"net/http/httptest"
	"time"
)

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

// HTTPErrorAnswer is the HTTP status and body the gateway's error handler
// writes for err.
func HTTPErrorAnswer(err error) (int, []byte) {
	rec := httptest.NewRecorder()
	httpError(context.Background(), nil, nil, rec, nil, err)
	return rec.Code, rec.Body.Bytes()
}

// HTTPHopErrors are the errors of the in-process hop's own refusals: a
// request on an HTTP connection that is closing, and one that came on no
// HTTP connection.
func HTTPHopErrors() (closing, outside error) {
	_, closing = (&httpConn{closed: true}).client()
	_, outside = connOf(context.Background())
	return closing, outside
}

// EndStreams does the step of Shutdown that ends the server's streams and
// waits (its context), and nothing else: gRPC keeps serving, as it does in
// the window before Shutdown's graceful stop tells connections to go away.
func EndStreams(s *Server) { s.cancel() }
