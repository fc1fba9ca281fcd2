package store

import "slices"

// The graph algorithms FindDeadlocks (deadlock_find.go) runs on its
// integer nodes.

// csr is the edges grouped by one end: the other ends of node v's edges
// are adj[start[v]:start[v+1]].
func csr(n int, by, other []int32) (start, adj []int32) {
	start = make([]int32, n+1)
	for _, v := range by {
		start[v+1]++
	}
	for v := range n {
		start[v+1] += start[v]
	}
	pos := slices.Clone(start[:n])
	adj = make([]int32, len(by))
	for e, v := range by {
		adj[pos[v]] = other[e]
		pos[v]++
	}
	return start, adj
}

// components returns the strongly connected component of every node not
// skipped, over the edges adj[start[v]:start[v+1]] between such nodes
// (Tarjan's algorithm, iterative so a long chain of waits cannot exhaust
// the stack), -1 for a skipped node, and how many components there are.
func components(start, adj []int32, skip []bool) ([]int32, int32) {
	n := len(skip)
	const unvisited = -1
	idx, low, comp := make([]int32, n), make([]int32, n), make([]int32, n)
	onStack := make([]bool, n)
	for i := range idx {
		idx[i], comp[i] = unvisited, unvisited
	}
	var stack []int32
	type frame struct{ v, next int32 }
	var call []frame
	counter, ncomp := int32(0), int32(0)
	for root := range int32(n) {
		if skip[root] || idx[root] != unvisited {
			continue
		}
		call = append(call[:0], frame{root, start[root]})
		idx[root], low[root] = counter, counter
		counter++
		stack = append(stack, root)
		onStack[root] = true
		for len(call) > 0 {
			f := &call[len(call)-1]
			v := f.v
			if f.next < start[v+1] {
				w := adj[f.next]
				f.next++
				switch {
				case skip[w]:
				case idx[w] == unvisited:
					idx[w], low[w] = counter, counter
					counter++
					stack = append(stack, w)
					onStack[w] = true
					call = append(call, frame{w, start[w]})
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
	return comp, ncomp
}
