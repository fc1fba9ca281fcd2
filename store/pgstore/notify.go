package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"lock.dev/lockd/store"
)

const (
	// listenerProbeInterval is how long the listening connection may be
	// quiet before the listener checks that it still answers, and
	// listenerProbeTimeout how long that check may take.
	listenerProbeInterval = 10 * time.Second
	listenerProbeTimeout  = 5 * time.Second
	// listenerConnectTimeout bounds one attempt to re-open the listening
	// connection.
	listenerConnectTimeout = 10 * time.Second
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
	"max_hold": store.EventMaxHold,
	"expired":  store.EventExpired,
	"value":    store.EventValue, // SetValue (queries.go setValue)
}

// parseNotices reads one notification into single-key events. The
// triggers send JSON arrays of events (migration 0002); Watch sends single
// sync markers. A payload that is not lockd's yields nothing.
func parseNotices(payload string) []notice {
	var ns []notice
	if strings.HasPrefix(payload, "[") {
		if err := json.Unmarshal([]byte(payload), &ns); err != nil {
			return nil // not ours
		}
	} else {
		var n notice
		if err := json.Unmarshal([]byte(payload), &n); err != nil {
			return nil // not ours
		}
		ns = []notice{n}
	}
	out := ns[:0:0]
	for _, n := range ns {
		if len(n.Keys) == 0 {
			out = append(out, n)
			continue
		}
		if len(n.Tokens) != len(n.Keys) {
			continue // not ours
		}
		for i, key := range n.Keys {
			out = append(out, notice{Kind: n.Kind, Key: key, Session: n.Session, Token: n.Tokens[i]})
		}
	}
	return out
}

// dispatch hands one notification to the local watches and waiters, as is
// (tests; the listener checks events first, see deliver).
func (s *Store) dispatch(payload string) {
	s.dispatchNotices(parseNotices(payload))
}

func (s *Store) dispatchNotices(ns []notice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range ns {
		s.dispatchLocked(n)
	}
}

// deliver checks one notification against the table, then dispatches it.
// Any database user may NOTIFY on the schema's channel (the name is
// predictable), so an event that ends a grant (released, revoked, expired)
// is believed only if the grant (key, token) is really gone from locks: a
// forged one for a grant that still stands is dropped (C2 #ct2-watch).
// Tokens are never reused and a deleted grant never comes back, so a real
// event always passes: PostgreSQL delivers a notification only after its
// transaction committed. acquired, value and dequeued events are not
// checked: nothing acts on an acquired or value event for safety (a value
// is read from the table by whoever shows it), and a dequeued one only
// makes a waiter look at the table again. An error (the check could not
// run) is returned and breaks the listener, which ends every watch (events
// may have been lost) and wakes every waiter once it is back.
//
// Events no local waiter or watch would act on are dropped first, before
// the check (issue 24: at distinct keys nearly every release has nobody
// waiting, and the check was a query per notification); an event of a
// grant this Store's own commit ended (goneGrants) needs no check, the
// grant being gone (issue 24: the lock-loss watch of every server keeps
// every event). Dropping one is what dispatching it would do. A waiter
// registered after the drop reads the table after it registers (Acquire's
// first attempt follows addWaiter), so it sees the committed change the
// event announced; a watch registered after it becomes active only with
// its sync marker, a later notification, and ignores this one either way.
func (s *Store) deliver(ctx context.Context, payload string) error {
	ns := s.consumed(parseNotices(payload))
	if len(ns) == 0 {
		return nil
	}
	var keys []string
	var tokens []int64
	for _, n := range ns {
		if endsGrant(n.Kind) && !s.gone.known(ctx, grantKey{n.Key, n.Token}) { // gone.go
			keys, tokens = append(keys, n.Key), append(tokens, int64(n.Token))
		}
	}
	if len(keys) > 0 {
		s.standingChecks.Add(1)
		cctx, cancel := context.WithTimeout(ctx, listenerProbeTimeout)
		rows, err := s.pool.Query(cctx, s.q.standing, keys, tokens)
		var standing []grantKey
		if err == nil {
			standing, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (grantKey, error) {
				var g grantKey
				var tok int64
				err := r.Scan(&g.key, &tok)
				g.token = uint64(tok)
				return g, err
			})
		}
		cancel()
		if err != nil {
			return fmt.Errorf("check events: %w", err)
		}
		if len(standing) > 0 {
			stands := make(map[grantKey]bool, len(standing))
			for _, g := range standing {
				stands[g] = true
			}
			ns = slices.DeleteFunc(ns, func(n notice) bool {
				return endsGrant(n.Kind) && stands[grantKey{n.Key, n.Token}]
			})
		}
	}
	s.dispatchNotices(ns)
	return nil
}

// grantKey identifies one grant.
type grantKey struct {
	key   string
	token uint64
}

// consumed keeps the events of ns that a local waiter or an active watch
// would act on (dispatchLocked): sync markers, events of a key with local
// waiters, and events under an active watch's prefix.
func (s *Store) consumed(ns []notice) []notice {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.DeleteFunc(ns, func(n notice) bool {
		if n.Kind == "sync" || len(s.waiters[n.Key]) > 0 {
			return false
		}
		if n.Kind == "dequeued" {
			return true // only wakes waiters
		}
		for w := range s.watches {
			if w.active && strings.HasPrefix(n.Key, w.prefix) {
				return false
			}
		}
		return true
	})
}

// endsGrant reports whether an event of kind says a grant is gone.
func endsGrant(kind string) bool {
	return kind == "released" || kind == "revoked" || kind == "expired" || kind == "max_hold"
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
	if kind != store.EventAcquired && kind != store.EventValue {
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
		w.ch <- withCursor(ev)
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
// kind and session per key, and PostgreSQL's NOTIFY costs by the byte.)
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
			if s.noticeGate != nil { // tests: the notification path held back
				select {
				case <-s.noticeGate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if err := s.deliver(ctx, n.Payload); err != nil {
				return err
			}
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
