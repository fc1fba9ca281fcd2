package store

import (
	"context"
	"errors"
	"slices"
	"strings"
)

// ErrDeadlock: an Acquire's wait was refused because it closed a cycle of
// waiting sessions (C2 #ct2-deadlock). The place in the queue was left;
// nothing else changed. Not retryable. The error is a *DeadlockError,
// which names the cycle's keys.
var ErrDeadlock = errors.New("store: deadlock")

// DeadlockError is the ErrDeadlock of one refused wait: Keys are the keys
// of the waits inside the cycle (sorted), the refused one among them.
type DeadlockError struct {
	Keys []string
}

func (e *DeadlockError) Error() string {
	return "store: deadlock: the wait closes a cycle of waiting sessions over keys " + strings.Join(e.Keys, ", ")
}

// Is makes errors.Is(err, ErrDeadlock) hold.
func (e *DeadlockError) Is(target error) bool { return target == ErrDeadlock }

// NoDeadlockCheck opts an Acquire out of deadlock refusal (C2
// #ct2-deadlock): its wait still counts in the wait-for graph, but it is
// never the one refused.
func NoDeadlockCheck() AcquireOption { return func(o *AcquireOptions) { o.NoDeadlockCheck = true } }

// DeadlockScanGater is implemented by a backend whose deadlock detector a
// test can drive scan by scan (C2 #ct2-deadlock, "Test hook"; storetest's
// DeadlockDissolved). SetDeadlockScanGate makes every scan that reads the
// wait-for graph call gate first and read only when it returns; nil
// removes it. gate must return when its context ends. Tests only: a gate
// that blocks stops detection.
type DeadlockScanGater interface {
	SetDeadlockScanGate(gate func(ctx context.Context))
}

// Wait is a session's place in a plain key's queue, as a backend read it
// for the wait-for graph.
type Wait struct {
	Session SessionID
	Key     string
	// Seq orders the waits by age: a place queued later has a larger Seq
	// (etcd: the waiter key's create revision; PostgreSQL: the row id).
	Seq int64
	// NoCheck: the place was queued with NoDeadlockCheck.
	NoCheck bool
}

// Hold is a session's grant of a plain key.
type Hold struct {
	Session SessionID
	Key     string
}

// WaitGraph is one consistent snapshot of a backend's plain-key waits and
// grants.
type WaitGraph struct {
	Waits []Wait
	Holds []Hold
}

// Deadlock is one cycle of waiting sessions FindDeadlocks found: Victim is
// the wait to refuse, Keys the keys of the cycle's waits (sorted, no
// duplicates).
type Deadlock struct {
	Victim Wait
	Keys   []string
}

// FindDeadlocks returns the deadlocks of g (C2 #ct2-deadlock): for every
// strongly connected component of two or more sessions of the wait-for
// graph (S waits for T when S waits for a key T holds), the component's
// youngest wait among those inside it (whose key a session of the
// component holds) that did not opt out. A component whose inside waits all
// opted out is not reported. The result is ordered by the victim's Seq; the
// same graph always gives the same result, whatever the order of its
// slices.
func FindDeadlocks(g WaitGraph) []Deadlock {
	holders := map[string][]SessionID{}
	for _, h := range g.Holds {
		holders[h.Key] = append(holders[h.Key], h.Session)
	}
	// Nodes are sessions, numbered in sorted order so the walk is
	// deterministic.
	var ids []SessionID
	seen := map[SessionID]bool{}
	for _, w := range g.Waits {
		if !seen[w.Session] {
			seen[w.Session] = true
			ids = append(ids, w.Session)
		}
	}
	for _, h := range g.Holds {
		if !seen[h.Session] {
			seen[h.Session] = true
			ids = append(ids, h.Session)
		}
	}
	slices.Sort(ids)
	index := make(map[SessionID]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	adj := make([][]int, len(ids))
	for _, w := range g.Waits {
		from := index[w.Session]
		for _, h := range holders[w.Key] {
			if h != w.Session {
				adj[from] = append(adj[from], index[h])
			}
		}
	}
	for i := range adj {
		slices.Sort(adj[i])
		adj[i] = slices.Compact(adj[i])
	}
	comp := tarjan(adj)

	// The inside waits of each component of two or more.
	size := map[int]int{}
	for _, c := range comp {
		size[c]++
	}
	type acc struct {
		victim Wait
		found  bool
		keys   []string
	}
	byComp := map[int]*acc{}
	for _, w := range g.Waits {
		c := comp[index[w.Session]]
		if size[c] < 2 {
			continue
		}
		inside := false
		for _, h := range holders[w.Key] {
			if h != w.Session && comp[index[h]] == c {
				inside = true
				break
			}
		}
		if !inside {
			continue
		}
		a := byComp[c]
		if a == nil {
			a = &acc{}
			byComp[c] = a
		}
		a.keys = append(a.keys, w.Key)
		if !w.NoCheck && (!a.found || w.Seq > a.victim.Seq || (w.Seq == a.victim.Seq && younger(w, a.victim))) {
			a.victim, a.found = w, true
		}
	}
	var out []Deadlock
	for _, a := range byComp {
		if !a.found {
			continue
		}
		slices.Sort(a.keys)
		out = append(out, Deadlock{Victim: a.victim, Keys: slices.Compact(a.keys)})
	}
	slices.SortFunc(out, func(x, y Deadlock) int {
		if x.Victim.Seq != y.Victim.Seq {
			if x.Victim.Seq < y.Victim.Seq {
				return -1
			}
			return 1
		}
		return strings.Compare(string(x.Victim.Session)+"\x00"+x.Victim.Key, string(y.Victim.Session)+"\x00"+y.Victim.Key)
	})
	return out
}

// younger breaks a tie of Seq (not produced by either backend) by session
// and key, so the victim does not depend on slice order.
func younger(w, than Wait) bool {
	if w.Session != than.Session {
		return w.Session > than.Session
	}
	return w.Key > than.Key
}

// tarjan returns the strongly connected component of every node of the
// graph adj (Tarjan's algorithm, iterative so a long chain of waits cannot
// exhaust the stack).
func tarjan(adj [][]int) []int {
	n := len(adj)
	const unvisited = -1
	idx, low, comp := make([]int, n), make([]int, n), make([]int, n)
	onStack := make([]bool, n)
	for i := range idx {
		idx[i], comp[i] = unvisited, unvisited
	}
	var stack []int
	type frame struct{ v, next int }
	counter, ncomp := 0, 0
	for root := range n {
		if idx[root] != unvisited {
			continue
		}
		call := []frame{{root, 0}}
		idx[root], low[root] = counter, counter
		counter++
		stack = append(stack, root)
		onStack[root] = true
		for len(call) > 0 {
			f := &call[len(call)-1]
			v := f.v
			if f.next < len(adj[v]) {
				w := adj[v][f.next]
				f.next++
				switch {
				case idx[w] == unvisited:
					idx[w], low[w] = counter, counter
					counter++
					stack = append(stack, w)
					onStack[w] = true
					call = append(call, frame{w, 0})
				case onStack[w]:
					low[v] = min(low[v], idx[w])
				}
				continue
			}
			if low[v] == idx[v] {
				for {
					w := stack[len(stack)-1]
					stack = stack[:len(stack)-1]
					onStack[w] = false
					comp[w] = ncomp
					if w == v {
						break
					}
				}
				ncomp++
			}
			call = call[:len(call)-1]
			if len(call) > 0 {
				u := call[len(call)-1].v
				low[u] = min(low[u], low[v])
			}
		}
	}
	return comp
}
