package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// notice is one event of a notification on the schema's channel. The
// triggers send arrays of lock events (kind acquired, released, revoked,
// expired) and "dequeued" events, one array per notification, each event
// itself an array (see UnmarshalJSON); Watch sends single "sync" markers
// as objects. The events pgstore sends itself (eventPayloads) are objects
// too, each standing for the events of many keys of one session: Keys and
// Tokens instead of Key and Token.
type notice struct {
	Kind    string   `json:"kind"`
	Key     string   `json:"key,omitempty"`
	Session string   `json:"session,omitempty"`
	Token   uint64   `json:"token,omitempty"`
	Sync    string   `json:"sync,omitempty"`
	Keys    []string `json:"keys,omitempty"`
	Tokens  []uint64 `json:"tokens,omitempty"`
	// Next is the key's first waiter after the change, when the sender
	// knew it: only that waiter is woken (see wakeLocked).
	Next string `json:"next,omitempty"`
}

// UnmarshalJSON reads either form of an event: the triggers' array
// [kind, key, session, token, next] (session and token null for
// "dequeued"; next, the key's first waiter, null or absent when there is
// none) or an object (sync markers, the events pgstore sends itself).
func (n *notice) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '[' {
		type plain notice // without this method
		return json.Unmarshal(b, (*plain)(n))
	}
	var f []json.RawMessage
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	if len(f) < 2 || len(f) > 5 {
		return fmt.Errorf("event has %d fields, want 2 to 5", len(f))
	}
	*n = notice{}
	dst := []any{&n.Kind, &n.Key, &n.Session, &n.Token, &n.Next} // null leaves a field empty
	for i, raw := range f {
		if err := json.Unmarshal(raw, dst[i]); err != nil {
			return err
		}
	}
	return nil
}

var eventKinds = map[string]store.EventKind{
	"acquired": store.EventAcquired,
	"released": store.EventReleased,
	"revoked":  store.EventRevoked,
	"expired":  store.EventExpired,
}

// watch is one Watch call's subscription. All fields are guarded by s.mu.
type watch struct {
	prefix string
	// ch has room for watchBuffer events plus the final error event: the
	// dispatcher sends an event only while fewer than watchBuffer are
	// queued, so every send, including the final one, is non-blocking.
	ch     chan store.Event
	sync   string        // marker that activates the watch
	active bool          // the marker arrived: events are delivered
	ready  chan struct{} // closed when active or ended
	done   bool
	err    error  // why a watch ended before it became active
	stop   func() // unregisters the context.AfterFunc
}

var errSlowConsumer = fmt.Errorf("pgstore: watch consumer fell %d events behind: %w", watchBuffer, store.ErrContention)

// Watch implements store.LockStore. The watch becomes active when a sync
// marker it sends through the database comes back on the listening
// connection: NOTIFY delivers in commit order, so from then on it sees every
// change committed after the marker, hence every change committed after
// Watch returns, and nothing committed before Watch was called.
func (s *Store) Watch(ctx context.Context, prefix string) (<-chan store.Event, error) {
	if err := store.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("pgstore: watch: %w", err)
	}
	if err := s.begin(ctx, "watch"); err != nil {
		return nil, err
	}
	start := time.Now()
	s.mu.Lock()
	if !s.listening {
		s.mu.Unlock()
		err := fmt.Errorf("pgstore: watch: notification listener is reconnecting: %w", store.ErrUnavailable)
		s.metrics.Request(telemetry.OpWatch, start, err)
		return nil, err
	}
	s.syncSeq++
	w := &watch{
		prefix: prefix,
		ch:     make(chan store.Event, watchBuffer+1),
		sync:   fmt.Sprintf("%s/%d", s.instance, s.syncSeq),
		ready:  make(chan struct{}),
	}
	s.watches[w] = struct{}{}
	s.mu.Unlock()

	payload, err := json.Marshal(notice{Kind: "sync", Sync: w.sync})
	if err == nil {
		_, err = s.pool.Exec(ctx, s.q.notify, s.channel, string(payload))
	}
	if err == nil {
		select {
		case <-w.ready:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	s.mu.Lock()
	if err == nil && !w.active {
		err = w.err // the listener broke before the marker arrived
	}
	if err != nil {
		s.endWatch(w, nil)
		s.mu.Unlock()
		err = classify(ctx, "watch", err)
		s.metrics.Request(telemetry.OpWatch, start, err)
		return nil, err
	}
	// Ends the watch when ctx ends; runs at once if it already has.
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.endWatch(w, nil)
	})
	w.stop = func() { stop() }
	s.mu.Unlock()
	s.metrics.Request(telemetry.OpWatch, start, nil)
	return w.ch, nil
}

// endWatch ends w: a delivering watch gets err (if any) as its last event,
// then its channel is closed. s.mu is held.
func (s *Store) endWatch(w *watch, err error) {
	if w.done {
		return
	}
	w.done = true
	delete(s.watches, w)
	if w.stop != nil {
		w.stop()
	}
	if w.active {
		if err != nil {
			w.ch <- store.Event{Err: err}
		}
	} else {
		w.err = err
		if w.err == nil {
			w.err = errClosed
		}
		close(w.ready)
	}
	close(w.ch)
}

// dispatch hands one notification to the local watches and waiters. The
// triggers send JSON arrays of events (migration 0002); Watch sends single
// sync markers.
func (s *Store) dispatch(payload string) {
	var ns []notice
	if strings.HasPrefix(payload, "[") {
		if err := json.Unmarshal([]byte(payload), &ns); err != nil {
			return // not ours
		}
	} else {
		var n notice
		if err := json.Unmarshal([]byte(payload), &n); err != nil {
			return // not ours
		}
		ns = []notice{n}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range ns {
		if len(n.Keys) == 0 {
			s.dispatchLocked(n)
			continue
		}
		if len(n.Tokens) != len(n.Keys) {
			continue // not ours
		}
		for i, key := range n.Keys {
			s.dispatchLocked(notice{Kind: n.Kind, Key: key, Session: n.Session, Token: n.Tokens[i]})
		}
	}
}

// dispatchLocked handles one event. s.mu is held.
func (s *Store) dispatchLocked(n notice) {
	if n.Kind == "sync" {
		for w := range s.watches {
			if !w.active && w.sync == n.Sync {
				w.active = true
				close(w.ready)
			}
		}
		return
	}
	if n.Kind == "dequeued" {
		s.wakeLocked(n.Key, store.SessionID(n.Next)) // the next waiter may now be first
		return
	}
	kind, ok := eventKinds[n.Kind]
	if !ok {
		return
	}
	if kind != store.EventAcquired {
		s.wakeLocked(n.Key, store.SessionID(n.Next)) // the key is free
	}
	ev := store.Event{Kind: kind, Key: n.Key, Session: store.SessionID(n.Session), Token: n.Token}
	for w := range s.watches {
		if !w.active || !strings.HasPrefix(n.Key, w.prefix) {
			continue
		}
		if len(w.ch) >= watchBuffer {
			s.endWatch(w, errSlowConsumer)
			continue
		}
		w.ch <- ev
	}
}

// maxPayload bounds the notifications pgstore sends itself, below
// PostgreSQL's limit of 8000 bytes.
const maxPayload = 7000

// notifyExpired sends, inside tx, the expired events of grants whose rows tx
// deletes with the trigger silenced (notifiedSelf), in the triggers' format:
// several events per notification.
func (s *Store) notifyExpired(ctx context.Context, tx pgx.Tx, grants []store.Grant) error {
	if len(grants) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, s.q.notifyMany, s.channel, eventPayloads("expired", grants))
	return err
}

// eventPayloads encodes one event of kind per grant, compactly: each
// payload is a JSON array holding one object for a run of grants of one
// session, {"kind", "session", "keys": [...], "tokens": [...]}, at most
// maxPayload bytes. (The triggers' [kind, key, session, token] form repeats
// kind and session per key: more than twice the bytes for the 10 000 locks
// of one session, and PostgreSQL's NOTIFY costs by the byte.)
func eventPayloads(kind string, grants []store.Grant) []string {
	var (
		payloads     []string
		head         []byte // [{"kind":...,"session":...,"keys":[
		keys, tokens []byte // the run's keys and tokens so far, comma-separated
		session      store.SessionID
		ev, tok      []byte
	)
	flush := func() {
		if len(keys) == 0 {
			return
		}
		p := make([]byte, 0, len(head)+len(keys)+len(tokens)+16)
		p = append(p, head...)
		p = append(p, keys...)
		p = append(p, `],"tokens":[`...)
		p = append(p, tokens...)
		p = append(p, "]}]"...)
		payloads = append(payloads, string(p))
		keys, tokens = keys[:0], tokens[:0]
	}
	for _, g := range grants {
		if g.Session != session || len(keys) == 0 {
			flush()
			session = g.Session
			head = append(head[:0], `[{"kind":`...)
			head = appendJSONString(head, kind)
			head = append(head, `,"session":`...)
			head = appendJSONString(head, string(g.Session))
			head = append(head, `,"keys":[`...)
		}
		ev = appendJSONString(ev[:0], g.Key)
		tok = strconv.AppendUint(tok[:0], g.Token, 10)
		// 17: the closing and joining punctuation, with two commas.
		if len(keys) > 0 && len(head)+len(keys)+len(tokens)+len(ev)+len(tok)+17 > maxPayload {
			flush()
		}
		if len(keys) > 0 {
			keys, tokens = append(keys, ','), append(tokens, ',')
		}
		keys, tokens = append(keys, ev...), append(tokens, tok...)
	}
	flush()
	return payloads
}

// appendJSONString appends s as a JSON string. Printable ASCII other than
// '"' and '\\' goes as is; any other string takes encoding/json's way.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '"' || c == '\\' {
			enc, _ := json.Marshal(s) // a string always encodes
			return append(b, enc...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// connectListener opens the listening connection and issues LISTEN.
func (s *Store) connectListener(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.listenConfig.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// listen owns the listening connection: it dispatches notifications until
// the connection breaks, then ends every watch (events may have been lost)
// and reconnects with backoff; once LISTEN is back it wakes every waiter to
// re-check. It returns when ctx (the Store's) is cancelled by Close.
func (s *Store) listen(ctx context.Context, conn *pgx.Conn) {
	defer s.wg.Done()
	const minBackoff, maxBackoff = 50 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	for {
		if conn != nil {
			err := s.receive(ctx, conn)
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			cancel()
			conn = nil
			s.listenerDown(ctx, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, listenerConnectTimeout)
		c, err := s.connectListener(cctx)
		cancel()
		if err != nil {
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff, conn = minBackoff, c
		s.mu.Lock()
		s.listening = true
		s.wakeAllLocked()
		s.mu.Unlock()
	}
}

// receive dispatches the notifications arriving on conn until it fails or
// ctx ends. After probeInterval without a notification it checks that the
// connection still answers, so a silently dead connection (no FIN, no RST)
// breaks the watches within about probeInterval + listenerProbeTimeout
// instead of stalling them.
func (s *Store) receive(ctx context.Context, conn *pgx.Conn) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, s.probeInterval)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			s.dispatch(n.Payload)
		case ctx.Err() == nil && pgconn.Timeout(err) && !conn.IsClosed():
			pctx, cancel := context.WithTimeout(ctx, listenerProbeTimeout)
			_, err = conn.Exec(pctx, "SELECT 1") // notifications meanwhile are buffered
			cancel()
			if err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// listenerDown ends every watch after the listening connection broke.
func (s *Store) listenerDown(ctx context.Context, cause error) {
	err := errClosed
	if ctx.Err() == nil {
		err = classify(ctx, "watch", cause)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listening = false
	for w := range s.watches {
		s.endWatch(w, err)
	}
}

// reapLoop runs the reaper every reaperInterval until ctx is cancelled.
func (s *Store) reapLoop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.reaperInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.reap(ctx)
		}
	}
}

// reap deletes the sessions whose expires_at has passed, in batches; the
// cascade deletes their locks and queue entries. Rows are claimed with FOR
// UPDATE SKIP LOCKED, so concurrent reapers (other replicas) never wait for
// or double-count each other, and a row a heartbeat is updating right now is
// left for the next run. Failures are counted in
// lockd_backend_errors_total{op="reap"} and retried on the next tick.
func (s *Store) reap(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, reapTimeout)
	defer cancel()
	for {
		start := time.Now()
		var ids []string
		var grants []store.Grant
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			ids, grants = nil, nil
			rows, err := tx.Query(ctx, s.q.reapSelect, reapBatch)
			if err != nil {
				return err
			}
			if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(ids) == 0 {
				return err
			}
			rows, err = tx.Query(ctx, s.q.reapLocks, ids)
			if err != nil {
				return err
			}
			grants, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Grant, error) {
				var g store.Grant
				var sid string
				var tok int64
				err := r.Scan(&sid, &g.Key, &tok, &g.AcquiredAt)
				g.Session, g.Token = store.SessionID(sid), uint64(tok)
				return g, err
			})
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, s.q.notifiedSelf); err != nil {
				return err
			}
			// FOR UPDATE above keeps grants out of these sessions, so the
			// cascade deletes exactly the locks read above.
			if _, err := tx.Exec(ctx, s.q.reapDelete, ids); err != nil {
				return err
			}
			return s.notifyExpired(ctx, tx, grants)
		})
		err = classify(ctx, "reap", err)
		s.metrics.Request(telemetry.OpReap, start, err)
		if err != nil {
			return
		}
		bySession := make(map[store.SessionID][]store.Grant)
		for _, g := range grants {
			bySession[g.Session] = append(bySession[g.Session], g)
		}
		for _, id := range ids {
			s.sessionExpired(store.SessionID(id), bySession[store.SessionID(id)])
		}
		if len(ids) < reapBatch {
			return
		}
	}
}
