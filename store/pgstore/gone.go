package pgstore

import (
	"context"
	"sync"
)

// goneCap is how many ended grants a Store remembers (goneGrants): at
// thousands of releases per second, the last second or so, far longer than
// a notification takes to come back to the listener.
const goneCap = 4096

// goneGrants remembers the grants whose end this Store's own lock batches
// committed (issue 24). The listener believes an event that ends a grant
// only once the grant is gone from the table (deliver: the guard against
// forged NOTIFYs), which cost a query per released event under a watch of
// every key — and every `lockd serve` keeps one (the lock-loss watch). A
// grant remembered here is gone for good (a commit that returned deleted
// it; tokens are never reused, nor a deleted grant restored), so its event
// needs no query.
//
// A release is marked pending from before its batch is sent until its
// outcome is known; the notification of a real release comes only after
// its commit, so the listener, finding the grant pending, waits for that
// outcome (the batch's answer, already on its way) instead of querying. A
// grant not remembered (ended by another Store, by a release run alone, or
// longer ago than the last goneCap) is checked as before.
type goneGrants struct {
	mu      sync.Mutex
	set     map[grantKey]struct{}
	ring    []grantKey // the remembered grants in the order added; the oldest at next once full
	next    int
	pending map[grantKey]chan struct{} // releases in a batch being run; closed when settled
}

// sending marks the releases gs as in a batch being run and returns the
// mark settle takes.
func (x *goneGrants) sending(gs []grantKey) chan struct{} {
	if len(gs) == 0 {
		return nil
	}
	ch := make(chan struct{})
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.pending == nil {
		x.pending = make(map[grantKey]chan struct{})
	}
	for _, g := range gs {
		x.pending[g] = ch
	}
	return ch
}

// settle ends the mark ch of gs once their batch's outcome is known:
// those for which freed is true (their commit returned) are remembered as
// gone. freed nil: none was (the batch failed).
func (x *goneGrants) settle(gs []grantKey, ch chan struct{}, freed func(i int) bool) {
	if ch == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, g := range gs {
		if x.pending[g] == ch {
			delete(x.pending, g)
		}
		if freed != nil && freed(i) {
			x.addLocked(g)
		}
	}
	close(ch)
}

// add remembers g as gone (its commit returned).
func (x *goneGrants) add(g grantKey) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.addLocked(g)
}

// addLocked remembers g, forgetting the oldest grant once goneCap are
// remembered. x.mu is held.
func (x *goneGrants) addLocked(g grantKey) {
	if x.set == nil {
		x.set = make(map[grantKey]struct{}, goneCap)
	}
	if _, ok := x.set[g]; ok {
		return
	}
	if len(x.ring) < goneCap {
		x.ring = append(x.ring, g)
	} else {
		delete(x.set, x.ring[x.next])
		x.ring[x.next] = g
		x.next = (x.next + 1) % goneCap
	}
	x.set[g] = struct{}{}
}

// known reports whether g is gone by this Store's own commit; for a
// release still in a batch being run it first waits for the batch's
// outcome (or for ctx to end: then false).
func (x *goneGrants) known(ctx context.Context, g grantKey) bool {
	x.mu.Lock()
	_, ok := x.set[g]
	ch := x.pending[g]
	x.mu.Unlock()
	if ok || ch == nil {
		return ok
	}
	select {
	case <-ch:
	case <-ctx.Done():
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok = x.set[g]
	return ok
}
