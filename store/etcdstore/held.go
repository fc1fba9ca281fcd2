package etcdstore

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"lock.dev/lockd/store"
)

// The held-set index: what LocksOf answers from (C2 #ct2-confirm, issue 14).
//
// A server over etcd reads a session's grants before every live heartbeat
// answer (store.LockStore.SharesSessions). Reading them per session costs a lease
// TimeToLive with its attached keys and a read of those keys: at 10 000 idle
// sessions that was most of lockd's idle CPU. Instead a Store keeps an index
// of every grant under its prefix (plain grants l/<key> and slots
// m/<key>\x00s<id>) and of every session record (s/<id>, with its lease),
// loaded with one range read and kept current by one watch of
// [P l/, P s0) (heldRange, keys.go; it also carries waiters and keeper
// records, ignored), and answers
// LocksOf from it — but only once the index is proven current:
//
//  1. Concurrent LocksOf calls share a round. A round starts after every one
//     of its calls began (it takes only calls already queued) and sends one
//     linearizable read (a count of one key: only its header matters). Its
//     header revision R is at or after every write that completed before
//     the round started, hence before any of its calls began.
//  2. The round then waits until the index has applied every change with a
//     revision ≤ R: either an event with revision ≥ R arrived, or etcd
//     answered a progress request (clientv3 RequestProgress on the index's
//     own watch stream) with a revision ≥ R. etcd sends a progress
//     notification only when the watcher is synced, and after every event
//     up to that revision (mvcc progressIfSync), and clientv3 delivers it in
//     order with the events; the watch member's revision may trail another
//     member's, so the request is repeated until it reaches R.
//  3. Each call's answer is then the index's grants of the session whose
//     lease is the session's: the backend's state at revision ≥ R, i.e. at
//     a point between the call's start and its return — what a read of its
//     own would return (linearizable). A session whose record the index
//     does not have (or has on another lease) is dead, as a gone lease was.
//
// A grant revoked or released through any Store before the call began is
// therefore never listed, and a grant made through any Store before the
// call began is always listed. This is the same approach as Kubernetes'
// consistent reads from its watch cache (a linearizable revision read, then
// waiting for the cache to reach it with progress requests).
//
// When the index is not ready (loading, its watch broken and being
// re-established) or does not reach R within heldWait, the round's calls
// fall back to reading their sessions directly (locksOfDirect, the old
// path). Nothing is ever answered from an index that was not shown current.
const (
	// maxHeldRound bounds the calls of one round (their answers are built
	// under the index's lock).
	maxHeldRound = 1024
	// heldWait bounds how long a round waits for the index to reach its
	// revision before its calls read directly.
	heldWait = 2 * time.Second
	// heldProgressEvery is how often a waiting round repeats its progress
	// request (etcd drops one that finds the watcher unsynced).
	heldProgressEvery = 20 * time.Millisecond
	// heldRoundTimeout bounds a round's revision read.
	heldRoundTimeout = 5 * time.Second
	// heldLoadPage is the page size of the index's initial range read.
	heldLoadPage = 5000
)

// indexedGrant is one grant in the index.
type indexedGrant struct {
	g     store.Grant
	lease clientv3.LeaseID
}

// heldReq is one LocksOf call waiting for a round.
type heldReq struct {
	ctx  context.Context
	ss   *session
	done chan struct{} // closed when answered

	// Set by the round before done is closed.
	direct bool // read directly (the index could not be shown current)
	dead   bool // the session record is gone
	grants []store.Grant
	err    error
}

// heldIndex is the Store's held-set index and its round queue. Its two
// goroutines start with the first LocksOf and stop on Close. grants is
// keyed by etcd key; bySess lists each session's grant keys.
type heldIndex struct {
	s *Store

	// Test hooks, set before the first LocksOf.
	onRound     func(n int)  // sessions of each round, before its read
	beforeApply func()       // before each watch response is applied
	onDirect    func()       // a round's calls fall back to reading directly
	noBarrier   atomic.Bool  // control only: answer without waiting for R
	wait        atomic.Int64 // heldWait, as nanoseconds (tests change it)

	mu      sync.Mutex
	started bool
	pending []*heldReq
	wake    chan struct{} // signalled (buffered 1) when pending grows

	ready   bool          // loaded and watching
	rev     int64         // every change with a revision ≤ rev is applied
	changed chan struct{} // closed and replaced when ready or rev change
	grants  map[string]indexedGrant
	bySess  map[store.SessionID]map[string]struct{}
	records map[store.SessionID]clientv3.LeaseID // session records: the lease each is on
}

func newHeldIndex(s *Store) *heldIndex {
	h := &heldIndex{s: s, wake: make(chan struct{}, 1), changed: make(chan struct{})}
	h.wait.Store(int64(heldWait))
	return h
}

// start starts the index's goroutines once; false when the Store is closed.
func (h *heldIndex) start() bool {
	s := h.s
	s.mu.Lock() // Close sets closed under s.mu before it waits for s.wg
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.started {
		h.started = true
		s.wg.Add(2)
		go h.watchLoop() // exits when Close cancels s.ctx
		go h.roundLoop() // exits when Close cancels s.ctx, answering what is queued
	}
	return true
}

// locksOf answers one LocksOf call through a round. direct is true when the
// caller must read the session itself.
func (h *heldIndex) locksOf(ctx context.Context, ss *session) (grants []store.Grant, direct bool, err error) {
	if !h.start() {
		return nil, false, errClosed
	}
	r := &heldReq{ctx: ctx, ss: ss, done: make(chan struct{})}
	h.mu.Lock()
	h.pending = append(h.pending, r)
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, false, ctx.Err() // the round skips or ignores it
	case <-h.s.ctx.Done():
		return nil, false, errClosed // queued after roundLoop's last drain
	}
	switch {
	case r.err != nil:
		return nil, false, r.err
	case r.direct:
		return nil, true, nil
	case r.dead:
		return nil, false, store.ErrSessionDead
	}
	return r.grants, false, nil
}

// roundLoop runs one round at a time with the calls queued when it starts.
func (h *heldIndex) roundLoop() {
	defer h.s.wg.Done()
	for {
		select {
		case <-h.s.ctx.Done():
			h.mu.Lock()
			left := h.pending
			h.pending = nil
			h.mu.Unlock()
			for _, r := range left {
				r.err = errClosed
				close(r.done)
			}
			return
		case <-h.wake:
		}
		for {
			h.mu.Lock()
			var round []*heldReq
			for len(h.pending) > 0 && len(round) < maxHeldRound {
				r := h.pending[0]
				h.pending = h.pending[1:]
				if r.ctx.Err() != nil {
					close(r.done) // its caller is gone
					continue
				}
				round = append(round, r)
			}
			h.mu.Unlock()
			if len(round) == 0 {
				break
			}
			h.runRound(round)
		}
	}
}

// runRound answers round (see the file comment).
func (h *heldIndex) runRound(round []*heldReq) {
	s := h.s
	defer func() {
		for _, r := range round {
			close(r.done)
		}
	}()
	if h.onRound != nil {
		h.onRound(len(round))
	}
	// 1. One linearizable read after every call of the round began.
	ctx, cancel := context.WithTimeout(s.ctx, heldRoundTimeout)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.prefix+epochName, clientv3.WithCountOnly())
	if err != nil {
		err = classify(ctx, err)
		for _, r := range round {
			r.err = err
		}
		return
	}
	// 2. Wait for the index to reach that revision.
	if !h.noBarrier.Load() && !h.reach(ctx, resp.Header.Revision) {
		if h.onDirect != nil {
			h.onDirect()
		}
		for _, r := range round {
			r.direct = true
		}
		return
	}
	// 3. Answer from the index.
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range round {
		lease, ok := h.records[r.ss.id]
		if !ok || lease != r.ss.lease {
			r.dead = true
			continue
		}
		r.grants = nil
		for k := range h.bySess[r.ss.id] {
			if ig := h.grants[k]; ig.lease == lease {
				r.grants = append(r.grants, ig.g)
			}
		}
		slices.SortFunc(r.grants, func(a, b store.Grant) int { return strings.Compare(a.Key, b.Key) })
	}
}

// reach waits until the index is ready and has applied every change up to
// rev, asking etcd for progress meanwhile; false after heldWait or when ctx
// ends first.
func (h *heldIndex) reach(ctx context.Context, rev int64) bool {
	deadline := time.NewTimer(time.Duration(h.wait.Load()))
	defer deadline.Stop()
	var tick <-chan time.Time
	for {
		h.mu.Lock()
		ready, at, changed := h.ready, h.rev, h.changed
		h.mu.Unlock()
		if ready && at >= rev {
			return true
		}
		if ready && tick == nil {
			t := time.NewTicker(heldProgressEvery)
			defer t.Stop()
			tick = t.C
			h.requestProgress(ctx)
		}
		select {
		case <-changed:
		case <-tick:
			h.requestProgress(ctx)
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// heldStream is the outgoing metadata that gives the index's watch a gRPC
// watch stream of its own (clientv3 shares a stream between watches with
// the same metadata): progress requests then concern this watch only.
var heldStream = metadata.Pairs("lockd-watch", "held-index")

func (h *heldIndex) watchCtx(ctx context.Context) context.Context {
	return clientv3.WithRequireLeader(metadata.NewOutgoingContext(ctx, heldStream))
}

func (h *heldIndex) requestProgress(ctx context.Context) {
	_ = h.s.cli.RequestProgress(h.watchCtx(ctx)) // a lost request is repeated
}

// setLocked records a change of ready or rev (h.mu held).
func (h *heldIndex) setLocked(ready bool, rev int64) {
	h.ready, h.rev = ready, max(h.rev, rev)
	if !ready {
		h.rev = 0
	}
	close(h.changed)
	h.changed = make(chan struct{})
}

// watchLoop loads the index and keeps it current, loading it again whenever
// the watch breaks (compaction, a lost leader, an error).
func (h *heldIndex) watchLoop() {
	s := h.s
	defer s.wg.Done()
	delay := 50 * time.Millisecond
	for s.ctx.Err() == nil {
		rev, err := h.load()
		if err == nil {
			delay = 50 * time.Millisecond
			h.follow(rev)
		}
		h.mu.Lock()
		h.setLocked(false, 0)
		h.mu.Unlock()
		t := time.NewTimer(delay)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// load reads the whole range at one revision into a new index.
func (h *heldIndex) load() (int64, error) {
	s := h.s
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	grants := make(map[string]indexedGrant)
	records := make(map[store.SessionID]clientv3.LeaseID)
	from, end := s.heldRange()
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(heldLoadPage),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, from, opts...)
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if ig, ok := s.indexedGrantOf(kv); ok {
				grants[string(kv.Key)] = ig
			} else if id, ok := s.recordID(kv.Key); ok {
				records[id] = clientv3.LeaseID(kv.Lease)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	h.mu.Lock()
	h.grants, h.records = grants, records
	h.bySess = make(map[store.SessionID]map[string]struct{})
	for k, ig := range grants {
		h.indexLocked(k, ig)
	}
	h.setLocked(true, rev)
	h.mu.Unlock()
	return rev, nil
}

// follow applies the watch from rev+1 until it breaks or the Store closes.
func (h *heldIndex) follow(rev int64) {
	s := h.s
	ctx, cancel := context.WithCancel(h.watchCtx(s.ctx))
	defer cancel()
	from, end := s.heldRange()
	wch := s.cli.Watch(ctx, from, clientv3.WithRange(end), clientv3.WithRev(rev+1))
	for resp := range wch {
		if resp.Canceled || resp.Err() != nil {
			return
		}
		if h.beforeApply != nil {
			h.beforeApply()
		}
		h.mu.Lock()
		at := resp.Header.Revision // a progress notification: synced up to here
		if len(resp.Events) > 0 {
			// An event response's header may be ahead of its events (an
			// unsynced watcher catching up): only the events' revision counts.
			at = resp.Events[len(resp.Events)-1].Kv.ModRevision
		}
		for _, ev := range resp.Events {
			if id, ok := s.recordID(ev.Kv.Key); ok {
				if ev.Type == clientv3.EventTypePut {
					h.records[id] = clientv3.LeaseID(ev.Kv.Lease)
				} else {
					delete(h.records, id)
				}
				continue
			}
			k := string(ev.Kv.Key)
			h.unindexLocked(k)
			if ev.Type == clientv3.EventTypePut {
				if ig, ok := s.indexedGrantOf(ev.Kv); ok {
					h.grants[k] = ig
					h.indexLocked(k, ig)
				}
			}
		}
		h.setLocked(true, at)
		h.mu.Unlock()
	}
}

func (h *heldIndex) indexLocked(k string, ig indexedGrant) {
	m := h.bySess[ig.g.Session]
	if m == nil {
		m = make(map[string]struct{})
		h.bySess[ig.g.Session] = m
	}
	m[k] = struct{}{}
}

func (h *heldIndex) unindexLocked(k string) {
	ig, ok := h.grants[k]
	if !ok {
		return
	}
	delete(h.grants, k)
	if m := h.bySess[ig.g.Session]; m != nil {
		delete(m, k)
		if len(m) == 0 {
			delete(h.bySess, ig.g.Session)
		}
	}
}

// indexedGrantOf decodes a grant key (plain or slot); ok is false for every
// other key of the range (markers, waiters, values) and for foreign data.
func (s *Store) indexedGrantOf(kv *mvccpb.KeyValue) (indexedGrant, bool) {
	lease := clientv3.LeaseID(kv.Lease)
	if key, ok := s.userKey(kv.Key); ok {
		holder, at, err := parseGrant(kv.Value)
		if err != nil {
			return indexedGrant{}, false
		}
		return indexedGrant{g: store.Grant{Key: key, Session: holder, Token: s.token(kv.ModRevision), AcquiredAt: at}, lease: lease}, true
	}
	if !s.isSlotKey(kv.Key) {
		return indexedGrant{}, false
	}
	_, tail, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), s.prefix+spaceMulti), "\x00")
	g, ok := s.multiGrantOf(kv, store.SessionID(strings.TrimPrefix(tail, "s")), lease)
	return indexedGrant{g: g, lease: lease}, ok
}
