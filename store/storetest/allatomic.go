package storetest

// One commit for a set of free keys (C2 #ct2-acquire-all).

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// testAcquireAllAtomic: AcquireAll of 8 free keys is granted in one commit.
// A List of the set's prefix, taken in a tight loop on another instance
// while the call runs, never shows the session holding some but not all of
// the keys. Rounds alternate wait and try. (The per-key path is seen
// holding 1..7 of them.)
func (s *suite) testAcquireAllAtomic(t *testing.T) {
	insts := s.instances(t, 2)
	const rounds, n = 8, 8
	lists := 0
	for round := range rounds {
		a := openSession(t, insts[0])
		prefix := fmt.Sprintf("aat/%02d/", round)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("%s%d", prefix, n-1-i) // not sorted: the call sorts
		}
		ctx, cancel := context.WithCancel(ctxT(t))
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			partial []int // the counts of a's keys seen, when 0 < count < n
			first   = make(chan struct{})
			count   int
			lerr    error
		)
		wg.Add(1)
		go func() { // the observer; exits when ctx is cancelled
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				infos, err := insts[1].List(ctx, prefix, "", 100)
				if err != nil {
					if ctx.Err() == nil {
						lerr = err
					}
					return
				}
				held := 0
				for _, info := range infos {
					if info.Session == a {
						held++
					}
				}
				mu.Lock()
				count++
				if held > 0 && held < n {
					partial = append(partial, held)
				}
				mu.Unlock()
				if i == 0 {
					close(first)
				}
			}
		}()
		select { // the observer is looking before the call starts
		case <-first:
		case <-ctx.Done():
		}
		gs, ok, err := insts[0].AcquireAll(ctxT(t), a, keys, round%2 == 0)
		cancel()
		wg.Wait()
		if lerr != nil {
			t.Fatalf("round %d: List(%q): %v", round, prefix, lerr)
		}
		if err != nil || !ok || len(gs) != n {
			t.Fatalf("round %d: AcquireAll of %d free keys = %d grants, %v, %v; want all", round, n, len(gs), ok, err)
		}
		if len(partial) > 0 {
			t.Fatalf("round %d: a List saw session %s holding %v of the %d keys of one AcquireAll; want 0 or %d (one commit)", round, a, partial, n, n)
		}
		lists += count
		releaseAll(t, insts[0], gs)
	}
	t.Logf("%d Lists over %d rounds saw no partial set", lists, rounds)
}
