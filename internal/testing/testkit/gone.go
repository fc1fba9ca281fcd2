package testkit

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// PeerConnFrames are the functions on the stacks of an HTTP/1 connection's
// goroutines (client side, server side) that outlive the etcd members of a
// test which runs several in its own process: a member's peer server can
// stay blocked in a read for up to etcd's peer read timeout (5 s) after the
// member stopped (etcd's timeoutConn sets its read deadline again on every
// read, over the one net/http sets to abort it), and the other member's idle
// client connection with it stays open meanwhile. The leak check of Main
// would report both.
var PeerConnFrames = []string{"net/http.(*persistConn).readLoop", "net/http.(*connReader).backgroundRead"}

// AwaitGone registers a cleanup, run after every cleanup registered later
// (servers the test stops), that waits up to within until no goroutine's
// stack contains any of frames, and fails the test if one still does.
func AwaitGone(t testing.TB, within time.Duration, frames ...string) {
	t.Helper()
	t.Cleanup(func() {
		err := Poll(within, func() error {
			buf := make([]byte, 1<<20)
			stacks := buf[:runtime.Stack(buf, true)]
			for _, f := range frames {
				if bytes.Contains(stacks, []byte(f)) {
					return fmt.Errorf("a goroutine still runs %s", f)
				}
			}
			return nil
		})
		if err != nil {
			t.Errorf("goroutines still running %v after the test ended: %v", within, err)
		}
	})
}
