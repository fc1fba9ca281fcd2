package store

import (
	"cmp"
	"slices"
	"strings"
)

// FindDeadlocks and the AND-OR graph it reduces (C2 #ct2-deadlock); the
// types it reads and answers are in deadlock.go.

// The nodes of the AND-OR graph FindDeadlocks reduces. A session waits for
// all of its waits; a plain or read/write wait for all of its targets,
// through a key's nodes for "every holder", "every exclusive holder" and
// the chains "every waiter ahead" and "every exclusive waiter ahead", so a
// queue of q waiters costs O(q) edges, not O(q²). A semaphore's waits wait
// for its nodeSem, which admits them in queue order by counting the free
// sessions among its holders and the waiters ahead (semQueue).
const (
	nodeSession = iota
	nodeWait
	nodeAll // free when all of its targets are
	nodeSem // a semaphore key: never free as a whole; admits its waits one by one
)

// andOr is the graph as it is built: nodes and edges (from waits for to).
type andOr struct {
	kind     []uint8
	need     []int32 // how many targets must be free; -1: all of them (set once the edges are known)
	wait     []int32 // nodeWait: the index of its Wait in the WaitGraph; -1 otherwise
	from, to []int32
}

func (a *andOr) node(kind uint8, need, wait int32) int32 {
	a.kind = append(a.kind, kind)
	a.need = append(a.need, need)
	a.wait = append(a.wait, wait)
	return int32(len(a.kind) - 1)
}

func (a *andOr) edge(from, to int32) {
	a.from = append(a.from, from)
	a.to = append(a.to, to)
}

// semQueue is a semaphore of N (limit) for the reduction (C2 #ct2-multi:
// the waiter at position i is admitted once every waiter ahead is, and at
// most N-1 of the h holders and the i waiters ahead are not free, i.e. at
// least h+i-N+1 of them are free). free counts the freed sessions among
// the holders and the waiters before next, the first waiter not yet
// admitted.
type semQueue struct {
	limit   int
	holders int
	waits   []int32         // the wait nodes, in queue order
	of      []int32         // their sessions
	pos     map[int32]int32 // a session's position in waits; -1 for a holder
	next    int
	free    int
}

// FindDeadlocks returns the deadlocks of g (C2 #ct2-deadlock), in the
// AND-OR wait-for model: a plain wait waits for the key's holder; a
// read/write exclusive wait for every holder and every waiter ahead of it;
// a shared wait for the exclusive holder and every exclusive waiter ahead;
// a semaphore wait of N at position i for every waiter ahead to be
// admitted and for h+i-N+1 of the h holders and i waiters ahead to be free
// (the head of a full semaphore: any one holder, an OR-wait). Graph
// reduction frees the sessions that can progress (a session none of whose
// waits is blocked counts off the waits that wait for it, ...); the
// sessions left are deadlocked. Their strongly connected components are
// taken sinks first, each reduced again once every component it waits for
// is counted as free (a refusal there ends it): what is left of a
// component of two or more sessions is a deadlocked set; in each, the
// youngest wait among the set's inside waits (those still blocked) that
// did not opt out is the victim, and the inside waits' keys are named. A set whose inside
// waits all opted out is not reported. For plain keys alone this is
// exactly the strongly connected components of two or more sessions and
// their waits whose key a session of the component holds. The result is
// ordered by the victim's Seq; the same graph always gives the same
// result, whatever the order of its slices. Linear in waits and holds
// (after grouping them by key).
func FindDeadlocks(g WaitGraph) []Deadlock {
	if len(g.Waits) == 0 {
		return nil
	}
	size := 2*len(g.Waits) + len(g.Holds)
	a := andOr{kind: make([]uint8, 0, size), need: make([]int32, 0, size), wait: make([]int32, 0, size),
		from: make([]int32, 0, size), to: make([]int32, 0, size)}
	session := make(map[SessionID]int32, len(g.Waits))
	sessionNode := func(id SessionID) int32 {
		v, ok := session[id]
		if !ok {
			v = a.node(nodeSession, -1, -1)
			session[id] = v
		}
		return v
	}
	type holder struct {
		node int32
		mode Mode
	}
	holders := make(map[string][]holder, len(g.Holds))
	for _, h := range g.Holds {
		holders[h.Key] = append(holders[h.Key], holder{sessionNode(h.Session), h.Mode})
	}
	// A plain wait waits for its key's holders: built at once. The others
	// need their key's queue in order: grouped by key first.
	waits := map[string][]int32{}
	for i, w := range g.Waits {
		s := sessionNode(w.Session)
		if w.Limit > 1 || w.Mode != ModeUnset {
			waits[w.Key] = append(waits[w.Key], int32(i))
			continue
		}
		v := a.node(nodeWait, -1, int32(i))
		a.edge(s, v)
		for _, h := range holders[w.Key] {
			if h.node != s { // a session asking again for its own key is not waiting
				a.edge(v, h.node)
			}
		}
	}
	// held and queued mark, per key being built, its holders and its
	// waiting sessions (the sessions are every node so far).
	held, queued := make([]int32, len(a.kind)), make([]int32, len(a.kind))
	mark := int32(0)
	sems := map[int32]*semQueue{}  // a semaphore chain's node: its queue
	semOf := map[int32]*semQueue{} // a semaphore wait: its queue
	for key, ws := range waits {
		mark++
		hs := holders[key]
		distinct := hs[:0:0]
		for _, h := range hs {
			if held[h.node] != mark {
				held[h.node] = mark
				distinct = append(distinct, h)
			}
		}
		hs = distinct
		var rw, sem bool
		for _, i := range ws {
			rw = rw || g.Waits[i].Mode != ModeUnset
			sem = sem || g.Waits[i].Limit > 1
		}
		if rw || sem {
			// "Ahead" needs the queue order.
			slices.SortFunc(ws, func(x, y int32) int { return compareAge(g.Waits[x], g.Waits[y]) })
		}
		var (
			all, excl           int32 = -1, -1 // built when first needed; -2: none
			aheadAll, aheadExcl int32 = -1, -1 // the chains' last nodes; -1: nobody ahead
			sq                  *semQueue
			ahead               int32 // the semaphore's chain: the holders, then each waiter ahead
		)
		if sem && !rw {
			ahead = a.node(nodeSem, -1, -1)
			sq = &semQueue{holders: len(hs), pos: map[int32]int32{}}
			sems[ahead] = sq
			for _, h := range hs {
				a.edge(ahead, h.node)
				sq.pos[h.node] = -1
			}
		}
		for _, i := range ws {
			w := g.Waits[i]
			s := session[w.Session]
			if held[s] == mark || queued[s] == mark {
				continue // holds the key (not waiting), or queued twice
			}
			queued[s] = mark
			switch {
			case sq != nil && w.Limit > 1 && w.Mode == ModeUnset:
				// Admitted by the key's semQueue, never by a count. Its
				// edge is to the chain of the holders and the waiters
				// ahead (the components' graph); the chain's nodes tell
				// the semQueue of each session freed.
				v := a.node(nodeWait, 1, i)
				a.edge(s, v)
				a.edge(v, ahead)
				if sq.limit == 0 {
					sq.limit = int(w.Limit)
				}
				sq.pos[s] = int32(len(sq.waits))
				sq.waits = append(sq.waits, v)
				sq.of = append(sq.of, s)
				semOf[v] = sq
				p := a.node(nodeSem, -1, -1)
				a.edge(p, ahead)
				a.edge(p, s)
				sems[p] = sq
				ahead = p
				continue
			case w.Mode == ModeExclusive:
				v := a.node(nodeWait, -1, i)
				a.edge(s, v)
				if all == -1 {
					all = -2
					if len(hs) > 0 {
						all = a.node(nodeAll, -1, -1)
						for _, h := range hs {
							a.edge(all, h.node)
						}
					}
				}
				if all >= 0 {
					a.edge(v, all)
				}
				if aheadAll >= 0 {
					a.edge(v, aheadAll)
				}
			case w.Mode == ModeShared:
				v := a.node(nodeWait, -1, i)
				a.edge(s, v)
				if excl == -1 {
					excl = -2
					for _, h := range hs {
						if h.mode == ModeExclusive {
							if excl < 0 {
								excl = a.node(nodeAll, -1, -1)
							}
							a.edge(excl, h.node)
						}
					}
				}
				if excl >= 0 {
					a.edge(v, excl)
				}
				if aheadExcl >= 0 {
					a.edge(v, aheadExcl)
				}
			default: // a plain key's wait (or one of another kind than the key's: not a backend's)
				v := a.node(nodeWait, -1, i)
				a.edge(s, v)
				for _, h := range hs {
					a.edge(v, h.node)
				}
				continue
			}
			// The read/write chains past this waiter, for the waiters
			// behind it.
			p := a.node(nodeAll, -1, -1)
			a.edge(p, s)
			if aheadAll >= 0 {
				a.edge(p, aheadAll)
			}
			aheadAll = p
			if w.Mode == ModeExclusive {
				p := a.node(nodeAll, -1, -1)
				a.edge(p, s)
				if aheadExcl >= 0 {
					a.edge(p, aheadExcl)
				}
				aheadExcl = p
			}
		}
		if sq != nil && sq.limit == 0 {
			sq.limit = 1 // no semaphore wait after all (queued twice): admits nothing it need not
		}
	}

	n := len(a.kind)
	outStart, out := csr(n, a.from, a.to)
	inStart, in := csr(n, a.to, a.from)
	for v := range n {
		if a.need[v] < 0 {
			a.need[v] = outStart[v+1] - outStart[v]
		}
	}

	// The reduction: free what can progress, count it off what waits for
	// it. cnt[v] is how many more of v's targets must be free. A
	// semaphore's chain nodes are never free: its semQueue admits its
	// waits, told by the chain of every holder and waiter freed.
	cnt := slices.Clone(a.need)
	free := make([]bool, n)   // freed (or, below, counted as free)
	popped := make([]bool, n) // freed and counted off what waits for it
	var stack []int32
	push := func(v int32) {
		free[v] = true
		stack = append(stack, v)
	}
	admit := func(q *semQueue) {
		for q.next < len(q.waits) {
			if w := q.waits[q.next]; !free[w] {
				if q.free < q.holders+q.next-q.limit+1 {
					return
				}
				push(w)
			}
			if popped[q.of[q.next]] {
				q.free++ // counted now that it is ahead; a later pop counts it below
			}
			q.next++
		}
	}
	release := func() {
		for len(stack) > 0 {
			v := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			popped[v] = true
			for _, d := range in[inStart[v]:inStart[v+1]] {
				if a.kind[d] == nodeSem {
					q := sems[d]
					if q.pos[v] < int32(q.next) {
						q.free++ // a holder, or a waiter ahead of the next to admit
					}
					admit(q)
					continue
				}
				cnt[d]--
				if cnt[d] == 0 && !free[d] {
					push(d)
				}
			}
		}
	}
	for v := range n {
		if cnt[v] <= 0 && a.kind[v] != nodeSem {
			push(int32(v))
		}
	}
	for _, q := range sems {
		admit(q) // a semaphore that is not full admits its head at once
	}
	release()
	deadlocked := false
	for v := range n {
		if a.kind[v] == nodeSession && !free[v] {
			deadlocked = true
			break
		}
	}
	if !deadlocked {
		return nil
	}

	// The deadlocked nodes' components, over the edges between them, taken
	// sinks first (Tarjan numbers them so). Each is reduced once every
	// component it waits for is counted as free: what is left is its
	// deadlocked set, which is then counted as free too (its refusal ends
	// it) before the components that wait for it.
	comp, ncomp := components(outStart, out, free)
	first := make([]int32, ncomp+1)
	for v := range n {
		if comp[v] >= 0 {
			first[comp[v]+1]++
		}
	}
	for c := range ncomp {
		first[c+1] += first[c]
	}
	members := make([]int32, first[ncomp])
	at := slices.Clone(first[:ncomp])
	for v := range n {
		if c := comp[v]; c >= 0 {
			members[at[c]] = int32(v)
			at[c]++
		}
	}
	type acc struct {
		victim Wait
		found  bool
		keys   []string
	}
	var found []Deadlock
	var set acc
	for c := range ncomp {
		set = acc{keys: set.keys[:0]}
		var queues []*semQueue
		sessions := 0
		for _, v := range members[first[c]:first[c+1]] {
			if free[v] || a.kind[v] == nodeSem {
				continue
			}
			switch a.kind[v] {
			case nodeSession:
				sessions++
			case nodeWait:
				w := g.Waits[a.wait[v]]
				set.keys = append(set.keys, w.Key)
				if !w.NoCheck && (!set.found || compareAge(w, set.victim) > 0) {
					set.victim, set.found = w, true
				}
				if q := semOf[v]; q != nil {
					queues = append(queues, q)
				}
			}
			push(v)
		}
		for _, q := range queues {
			admit(q)
		}
		release()
		if set.found && sessions >= 2 { // a cycle has two sessions at least
			keys := slices.Clone(set.keys)
			slices.Sort(keys)
			found = append(found, Deadlock{Victim: set.victim, Keys: slices.Compact(keys)})
		}
	}
	slices.SortFunc(found, func(x, y Deadlock) int { return compareAge(x.Victim, y.Victim) })
	return found
}

// compareAge orders waits by age: Seq, then (a tie, which neither backend
// produces) session and key, so the victim does not depend on slice order.
// The youngest wait compares greatest.
func compareAge(x, y Wait) int {
	if c := cmp.Compare(x.Seq, y.Seq); c != 0 {
		return c
	}
	if c := strings.Compare(string(x.Session), string(y.Session)); c != 0 {
		return c
	}
	return strings.Compare(x.Key, y.Key)
}
