//go:build lockd_recvtime_control

package client

import "time"

// trustFrom, in a build with the tag lockd_recvtime_control, breaks the
// send-time rule on purpose: it counts a reply's Remaining from when the
// reply was applied, not from when its request was sent. It exists only for
// the chaos suite's control run (test/chaos, control recvtime-sdk) and the
// unit test that must fail with it (TestDeadlineFromSendTime), which show
// that their checks can see the difference. Never build a real client with
// this tag.
func trustFrom(c Clock, _ time.Time) time.Time { return c.Now() }
