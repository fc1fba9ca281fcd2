//go:build !lockd_recvtime_control

package client

import "time"

// trustFrom returns the instant a reply's Remaining counts from: sent, the
// client's time when it sent the request the reply answers, never the time
// the reply arrived (C2 #ct2-deadline). The server measured Remaining from
// its receipt of the request, which is later than sent; counting from the
// arrival of the reply would add the reply's transit to the client's trust.
// The chaos suite's receive-time control swaps this function out
// (trust_recvtime.go).
func trustFrom(_ Clock, sent time.Time) time.Time { return sent }
