// Package deadlock is the deadlock detector both backends run (C2
// #ct2-deadlock): it scans the backend's wait-for graph while this instance
// has a waiting Acquire that checks for deadlocks, and refuses a local
// wait that was the victim of a cycle in two consecutive scans. The graph
// is read from the backend (Reader), so cycles across replicas are seen by
// every replica; each refuses only its own calls' waits.
package deadlock

import (
	"context"
	"sync"
	"time"

	"lock.dev/lockd/store"
)

// Interval is how often an instance with a local checking wait scans (C2
// #ct2-deadlock: refused within two intervals plus the scans, bound 2 s).
const Interval = 500 * time.Millisecond

// Reader reads one consistent snapshot of the backend's waits and grants,
// of every kind (plain, semaphore, read/write).
type Reader func(ctx context.Context) (store.WaitGraph, error)

type waitID struct {
	session store.SessionID
	key     string
}

type victimID struct {
	waitID
	seq int64
}

// Detector is one Store instance's detector. Its lock nests nothing.
type Detector struct {
	read Reader

	mu    sync.Mutex
	local map[waitID]map[*Wait]struct{}
	prev  map[victimID]bool // the local victims of the last scan
	gate  func(context.Context)
}

// SetGate makes every scan that reads the graph call gate first and read
// only when it returns (tests: store.DeadlockScanGater, C2 #ct2-deadlock);
// nil removes it. gate must return when its context ends.
func (d *Detector) SetGate(gate func(context.Context)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gate = gate
}

// New returns a detector reading the graph with read.
func New(read Reader) *Detector {
	return &Detector{read: read, local: map[waitID]map[*Wait]struct{}{}}
}

// Wait is a local Acquire call waiting for a key (of any kind) with
// deadlock checks on.
type Wait struct {
	d        *Detector
	id       waitID
	refused  chan struct{}
	err      *store.DeadlockError // set before refused is closed
	onRefuse func()
}

// Register records a local waiting call of session id for key until Done.
// onRefuse, if not nil, is called once when the wait is refused, after
// Refused is closed; it must not block.
func (d *Detector) Register(id store.SessionID, key string, onRefuse func()) *Wait {
	w := &Wait{d: d, id: waitID{id, key}, refused: make(chan struct{}), onRefuse: onRefuse}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.local[w.id] == nil {
		d.local[w.id] = map[*Wait]struct{}{}
	}
	d.local[w.id][w] = struct{}{}
	return w
}

// Refused is closed when the wait is refused; Err then says why.
func (w *Wait) Refused() <-chan struct{} { return w.refused }

// Err is the refusal, once Refused is closed.
func (w *Wait) Err() *store.DeadlockError {
	select {
	case <-w.refused:
		return w.err
	default:
		return nil
	}
}

// Done unregisters the wait.
func (w *Wait) Done() {
	d := w.d
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.local[w.id], w)
	if len(d.local[w.id]) == 0 {
		delete(d.local, w.id)
	}
}

// Run scans every interval until ctx ends. Its caller owns it.
func (d *Detector) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.Scan(ctx) //nolint:errcheck // a failed scan forgets its candidates; the next one reads again
		}
	}
}

// Scan is one pass: with no local wait it reads nothing; else it reads the
// graph, refuses the local victims that were victims in the previous scan
// too, and remembers the others. It returns how many calls it refused. A
// failed read forgets the candidates (a refusal needs two consecutive
// reads).
func (d *Detector) Scan(ctx context.Context) (int, error) {
	d.mu.Lock()
	idle := len(d.local) == 0
	if idle {
		d.prev = nil
	}
	gate := d.gate
	d.mu.Unlock()
	if idle {
		return 0, nil
	}
	if gate != nil {
		gate(ctx)
		if err := ctx.Err(); err != nil {
			return 0, err
		}
	}
	g, err := d.read(ctx)
	if err != nil {
		d.mu.Lock()
		d.prev = nil
		d.mu.Unlock()
		return 0, err
	}
	found := store.FindDeadlocks(g)
	d.mu.Lock()
	defer d.mu.Unlock()
	next := map[victimID]bool{}
	refused := 0
	for _, dl := range found {
		v := victimID{waitID{dl.Victim.Session, dl.Victim.Key}, dl.Victim.Seq}
		ws := d.local[v.waitID]
		if len(ws) == 0 {
			continue // another instance's call, or a kept place with none
		}
		if !d.prev[v] || controlOff {
			next[v] = true
			continue
		}
		for w := range ws {
			w.err = &store.DeadlockError{Keys: dl.Keys}
			close(w.refused)
			if w.onRefuse != nil {
				w.onRefuse()
			}
			refused++
		}
		delete(d.local, v.waitID)
	}
	d.prev = next
	return refused, nil
}
