package etcdstore

import (
	"container/heap"
	"time"
)

// dueHeap orders sessions by ka.dueAt, when the owner next needs to look
// at them. Guarded by keeper.mu.
type dueHeap []*session

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].ka.dueAt.Before(h[j].ka.dueAt) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].ka.dueIdx, h[j].ka.dueIdx = i+1, j+1
}
func (h *dueHeap) Push(x any) {
	ss := x.(*session)
	ss.ka.dueIdx = len(*h) + 1
	*h = append(*h, ss)
}
func (h *dueHeap) Pop() any {
	old := *h
	ss := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	ss.ka.dueIdx = 0
	return ss
}

// scheduleLocked makes the owner look at ss at at (moving it if it is
// scheduled already). The caller pokes the owner if at may be earlier
// than anything it waits for.
func (k *keeper) scheduleLocked(ss *session, at time.Time) {
	ss.ka.dueAt = at
	if ss.ka.dueIdx > 0 {
		heap.Fix(&k.due, ss.ka.dueIdx-1)
		return
	}
	heap.Push(&k.due, ss)
}

// nextSendAfter is when the keepalive after one sent at sent is due: the
// interval later, rounded up to the keeper's sendTick grid. The grid counts
// from k.epoch on the monotonic clock.
func (k *keeper) nextSendAfter(sent time.Time, ttl time.Duration) time.Time {
	at := sent.Add(keepaliveInterval(ttl))
	ticks := (at.Sub(k.epoch) + sendTick - 1) / sendTick
	return k.epoch.Add(ticks * sendTick)
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
