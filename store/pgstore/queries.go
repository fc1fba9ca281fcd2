package pgstore

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// queries are the statements of one schema, with the schema name quoted in.
type queries struct {
	openSession string
	secretHash  string
	setValue    string
	principal   string
	closeLock   string
	closeLocks  string
	expireLocks string
	closeDelete string
	locksOf     string

	locksOfBatch string

	expireLock   string
	expireDelete string

	grantCheck string
	holder     string
	insertLock string
	keyLock    string
	enqueue    string
	dequeue    string

	grantBatch     string
	waitGraph      string
	releaseBatch   string
	heartbeatBatch string

	release string
	revoke  string
	inspect string
	list    string

	listSessions string

	reapSelect string
	reapLocks  string
	reapDelete string

	notify       string
	standing     string
	notifyMany   string
	notifiedSelf string
	nudgeHead    string

	m multiQueries // semaphores and read/write locks (multi.go)

	// Lock-delay and maximum hold (delay.go).
	setPolicy   string
	delayLeft   string
	reapHolds   string
	reapDelays  string
	stampDelays string
}

func newQueries(schema, channel string) queries {
	qs := pgx.Identifier{schema}.Sanitize()
	seq := quoteLiteral(pgx.Identifier{schema, "fencing_token"}.Sanitize())
	keylock := quoteLiteral("lockd.key:" + schema + ":")
	r := strings.NewReplacer("{{s}}", qs, "{{seq}}", seq, "{{keylock}}", keylock, "{{channel}}", quoteLiteral(channel))
	return queries{
		m: newMultiQueries(r),
		openSession: r.Replace(`INSERT INTO {{s}}.sessions (id, ttl_ms, expires_at, secret_hash, owner, labels, principal)
			VALUES ($1, $2, now() + $2::bigint * interval '1 millisecond', $3, $4, $5::jsonb, NULLIF($6, ''))`),
		// SetValue: only the current grant (session, key, token) of a live
		// session; the token is not touched.
		// The value event of Watch goes in the same statement, in the
		// triggers' format ($5 is the channel): one row per grant updated.
		setValue: r.Replace(`WITH u AS (UPDATE {{s}}.locks SET value = $4
			WHERE key = $1 AND session_id = $2 AND token = $3
			AND EXISTS (SELECT 1 FROM {{s}}.sessions WHERE id = $2 AND expires_at > now())
			RETURNING key, session_id, token)
			SELECT pg_notify($5, json_build_array(json_build_array('value', key, session_id, token))::text) FROM u`),
		// Any row, expired or not: the caller only compares the hash.
		secretHash: r.Replace(`SELECT secret_hash FROM {{s}}.sessions WHERE id = $1`),
		principal:  r.Replace(`SELECT coalesce(principal, '') FROM {{s}}.sessions WHERE id = $1`),
		closeLock:  r.Replace(`SELECT expires_at > now() FROM {{s}}.sessions WHERE id = $1 FOR UPDATE`),
		// Deletes the locks itself (not by cascade) to return them: no
		// reason is set, so the watch reports them as expired.
		// Slots (multi.go) too. lockd.voluntary: a close hands its keys
		// over at once, without their lock-delays (migration 0007; slots
		// have none).
		closeLocks: r.Replace(`WITH l AS (DELETE FROM {{s}}.locks WHERE session_id = $1
				AND set_config('lockd.voluntary', 'on', true) IS NOT NULL RETURNING key, token),
			m AS (DELETE FROM {{s}}.slots WHERE session_id = $1 RETURNING key, token)
			SELECT key, token FROM l UNION ALL SELECT key, token FROM m`),
		// ExpireSession's form of closeLocks: an involuntary end, so the
		// delete trigger starts the locks' lock-delays (no lockd.voluntary).
		expireLocks: r.Replace(`WITH l AS (DELETE FROM {{s}}.locks WHERE session_id = $1 RETURNING key, token),
			m AS (DELETE FROM {{s}}.slots WHERE session_id = $1 RETURNING key, token)
			SELECT key, token FROM l UNION ALL SELECT key, token FROM m`),
		closeDelete: r.Replace(`DELETE FROM {{s}}.sessions WHERE id = $1`),
		// ExpireSession (expire.go): the session's remaining life on the
		// database clock at this moment (clock_timestamp, not the
		// transaction's now()), taken with the row locked; then the delete,
		// only if that life has run out.
		expireLock: r.Replace(`SELECT floor(extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint
			FROM {{s}}.sessions WHERE id = $1 FOR UPDATE`),
		expireDelete: r.Replace(`DELETE FROM {{s}}.sessions WHERE id = $1 AND expires_at <= clock_timestamp()`),
		locksOf: r.Replace(`SELECT s.expires_at > now(), l.key, l.token, l.acquired_at
			FROM {{s}}.sessions s LEFT JOIN (
				SELECT session_id, key, token, acquired_at FROM {{s}}.locks
				UNION ALL SELECT session_id, key, token, acquired_at FROM {{s}}.slots) l ON l.session_id = s.id
			WHERE s.id = $1 ORDER BY l.key`),
		// locksOf for the sessions $1 (sorted, distinct) at once: one row
		// per lock, or one with a NULL key for a session without any.
		// Semaphore and read/write slots count as locks, as in locksOf.
		locksOfBatch: r.Replace(`SELECT s.id, s.expires_at > now(), l.key, l.token, l.acquired_at
			FROM {{s}}.sessions s LEFT JOIN (
				SELECT session_id, key, token, acquired_at FROM {{s}}.locks WHERE session_id = ANY($1::text[])
				UNION ALL SELECT session_id, key, token, acquired_at FROM {{s}}.slots WHERE session_id = ANY($1::text[])) l
				ON l.session_id = s.id
			WHERE s.id = ANY($1::text[]) ORDER BY s.id, l.key`),

		// One look at everything a grant depends on: the session's
		// remaining life ($1), the key's holder and the first in its queue
		// ($2). FOR KEY SHARE OF s keeps the session row (and so the
		// liveness just checked) until commit: a close or reap waits for us
		// and its cascade then removes what we wrote. Heartbeats, which do
		// not touch the key, are not blocked.
		grantCheck: r.Replace(`SELECT floor(extract(epoch FROM s.expires_at - now()) * 1000000)::bigint,
			l.session_id, l.token, l.acquired_at,
			(SELECT w.session_id FROM {{s}}.waiters w WHERE w.key = $2 ORDER BY w.id LIMIT 1),
			EXISTS (SELECT 1 FROM {{s}}.slots m WHERE m.key = $2) OR EXISTS (SELECT 1 FROM {{s}}.slot_waiters m WHERE m.key = $2),
			EXISTS (SELECT 1 FROM {{s}}.delays d WHERE d.key = $2 AND (d.until > now() OR d.pending_ms IS NOT NULL))
			FROM {{s}}.sessions s LEFT JOIN {{s}}.locks l ON l.key = $2
			WHERE s.id = $1 FOR KEY SHARE OF s`),
		holder: r.Replace(`SELECT session_id, token, acquired_at FROM {{s}}.locks WHERE key = $1`),
		// Grants draw their token in the INSERT, under keyLock (see grant).
		insertLock: r.Replace(`INSERT INTO {{s}}.locks (key, session_id, token) VALUES ($1, $2, nextval({{seq}}))
			ON CONFLICT (key) DO NOTHING RETURNING token, acquired_at`),
		// The transaction-scoped advisory lock of each key of $1, taken in
		// one order (by hash) so that batches never deadlock on them. Every
		// grant holds its keys' locks from before it draws a token until it
		// commits (see grant).
		// keyLock is the first statement of every lock transaction (a
		// batch, a grant alone, GrantFree), and it sets plan_cache_mode to
		// force_generic_plan for the rest of that transaction only: the
		// statements after it (and the triggers' queries) are planned once
		// per connection instead of on every execution, where PostgreSQL
		// kept choosing custom plans for their array parameters — a third
		// of its CPU per pair at c=8 (issue 24, docs/backends.md). A plan
		// changes how a statement runs, never what it does.
		keyLock: r.Replace(`SELECT count(pg_advisory_xact_lock(x.h)),
				set_config('plan_cache_mode', 'force_generic_plan', true)
			FROM (SELECT DISTINCT hashtextextended({{keylock}} || k, 0) AS h
				FROM unnest($1::text[]) AS k ORDER BY h) x`),
		// A resumed place keeps its id (its place) and takes the call's
		// opt-out of deadlock refusal (C2 #ct2-deadlock).
		enqueue: r.Replace(`INSERT INTO {{s}}.waiters AS w (key, session_id, no_deadlock_check) VALUES ($1, $2, $3)
			ON CONFLICT (key, session_id) DO UPDATE SET no_deadlock_check = EXCLUDED.no_deadlock_check
			WHERE w.no_deadlock_check IS DISTINCT FROM EXCLUDED.no_deadlock_check`),
		// The wait-for graph (C2 #ct2-deadlock) in one statement, one
		// snapshot: every plain waiter ('w', its id, its opt-out) and every
		// plain grant ('h'). Semaphore and read/write slots and waiters are
		// not in it.
		// Every kind (C2 #ct2-deadlock): mode and lim are a slot's or slot
		// waiter's (0 and 1 for a plain row); ids of both waiter tables
		// share one sequence (migration 0014).
		waitGraph: r.Replace(`SELECT true, key, session_id, id, no_deadlock_check, 0::smallint, 1 FROM {{s}}.waiters
			UNION ALL SELECT false, key, session_id, 0, false, 0::smallint, 1 FROM {{s}}.locks WHERE token <> 0
			UNION ALL SELECT true, key, session_id, id, no_deadlock_check, mode, lim FROM {{s}}.slot_waiters
			UNION ALL SELECT false, key, session_id, 0, false, mode, lim FROM {{s}}.slots`),
		dequeue: r.Replace(`DELETE FROM {{s}}.waiters WHERE key = $1 AND session_id = $2`),

		// The delete reason for the trigger is set in the WHERE clause so the
		// statement stays one round trip: set_config(..., true) lasts until
		// the end of the (implicit) transaction, and row triggers run at the
		// end of the statement, after it. The holder's session must be live.
		release: r.Replace(`DELETE FROM {{s}}.locks
			WHERE key = $1 AND session_id = $2 AND token = $3
			AND EXISTS (SELECT 1 FROM {{s}}.sessions WHERE id = $2 AND expires_at > now())
			AND set_config('lockd.reason', 'released', true) IS NOT NULL
			RETURNING acquired_at`),
		// The group-commit forms (groupcommit.go). grantBatch: $1 sessions,
		// $2 keys (distinct), $3 whether each is an Acquire; one row per
		// request, i its 1-based position. Its checks are grantCheck's; it
		// runs after keyLock of all the keys. nudge wakes the first waiter
		// of a free key that a request found queued ahead of it (see
		// nudgeHead).
		// grantBatch's $4: each Acquire's store.NoDeadlockCheck, stored
		// with a new or resumed place. req clears lockd.handover, which a
		// releaseBatch before it in the transaction may have set: the
		// waiters this statement dequeues are not handed a key (their
		// dequeued events name the next in line; the row triggers fire at
		// the end of the statement, after req was read).
		grantBatch: r.Replace(`WITH req AS (
				SELECT r.sid, r.key, r.wait, r.nodl, r.i
				FROM unnest($1::text[], $2::text[], $3::bool[], $4::bool[]) WITH ORDINALITY AS r(sid, key, wait, nodl, i)
				WHERE set_config('lockd.handover', '', true) IS NOT NULL
			), live AS MATERIALIZED (
				SELECT s.id, floor(extract(epoch FROM s.expires_at - now()) * 1000000)::bigint AS rem_us
				FROM {{s}}.sessions s
				WHERE s.id IN (SELECT sid FROM req) AND s.expires_at > now()
				ORDER BY s.id
				FOR KEY SHARE OF s
			), st AS MATERIALIZED (
				SELECT req.i, req.sid, req.key, req.wait, req.nodl, live.rem_us,
					l.session_id AS holder, l.token AS htok, l.acquired_at AS hat,
					(SELECT w.session_id FROM {{s}}.waiters w WHERE w.key = req.key ORDER BY w.id LIMIT 1) AS head,
					EXISTS (SELECT 1 FROM {{s}}.slots m WHERE m.key = req.key)
						OR EXISTS (SELECT 1 FROM {{s}}.slot_waiters m WHERE m.key = req.key) AS multi,
					(SELECT greatest(ceil(extract(epoch FROM d.until - now()) * 1000000)::bigint, d.pending_ms * 1000)
						FROM {{s}}.delays d
						WHERE d.key = req.key AND (d.until > now() OR d.pending_ms IS NOT NULL)) AS delay_us
				FROM req LEFT JOIN live ON live.id = req.sid LEFT JOIN {{s}}.locks l ON l.key = req.key
			), el AS MATERIALIZED (
				SELECT st.*,
					coalesce(st.rem_us, 0) > 0 AS alive,
					coalesce(st.rem_us, 0) > 0 AND st.holder IS NULL AND NOT st.multi AND st.delay_us IS NULL
						AND (st.head IS NULL OR (st.wait AND st.head = st.sid)) AS eligible
				FROM st
			), ins AS (
				INSERT INTO {{s}}.locks (key, session_id, token)
				SELECT key, sid, nextval({{seq}}) FROM el WHERE eligible ORDER BY key
				ON CONFLICT (key) DO NOTHING
				RETURNING key, token, acquired_at
			), enq AS (
				INSERT INTO {{s}}.waiters AS w (key, session_id, no_deadlock_check)
				SELECT key, sid, nodl FROM el
				WHERE wait AND alive AND NOT eligible AND holder IS DISTINCT FROM sid AND NOT multi
				ORDER BY key
				ON CONFLICT (key, session_id) DO UPDATE SET no_deadlock_check = EXCLUDED.no_deadlock_check
				WHERE w.no_deadlock_check IS DISTINCT FROM EXCLUDED.no_deadlock_check
			), deq AS (
				DELETE FROM {{s}}.waiters w USING el
				WHERE w.key = el.key AND w.session_id = el.sid
				AND (el.wait AND (NOT el.alive OR el.holder = el.sid) OR el.key IN (SELECT key FROM ins))
			), nudge AS MATERIALIZED (
				SELECT pg_notify({{channel}}, json_build_array(json_build_array('dequeued', key, NULL, NULL, head))::text)
				FROM el WHERE alive AND holder IS NULL AND head IS NOT NULL AND head <> sid
			)
			SELECT el.i::int, el.rem_us, el.holder, el.htok, el.hat, ins.token, ins.acquired_at, el.eligible, el.multi, el.delay_us
			FROM el LEFT JOIN ins ON ins.key = el.key CROSS JOIN (SELECT count(*) FROM nudge) nz`),
		// releaseBatch: the releases of a lock batch and their hand-over
		// (C2 #ct2-release-handover, issue 24) in one statement, run after
		// keyLock of the released keys $1 (distinct; $2 sessions, $3
		// tokens), which it holds from before it draws a token (see grant).
		// del deletes each grant that is (key, session, token) of a live
		// session, as release does. Each key del freed, with no semaphore
		// or read/write state and no lock-delay running, goes to its first
		// queued session that is live (on the clock of this statement, its
		// row then kept until commit: a reap waits), which leaves the queue.
		// The statement's snapshot still shows the deleted rows, so a key
		// counts as free by being in del (the key lock keeps every other
		// grant out). ins reads del through cand and sorts it, so every
		// delete is done before the first insert, and the unique check of
		// an insert does not see a row this statement deleted. The granted
		// waiter's dequeued event names it, not the next in line
		// (lockd.handover, migration 0011; grantBatch clears it for the
		// rest of the transaction). Until issue 24's statement counts this
		// was three statements (the delete, the hand-over, the clear).
		// One row per grant deleted: key, acquired_at, and for a key
		// handed over the new grant's session, token, acquired_at and the
		// session's remaining life in µs read now, after its queue entry
		// (and so its request) arrived: the grant's Remaining (C2
		// #ct2-deadline).
		releaseBatch: r.Replace(`WITH del AS (
				DELETE FROM {{s}}.locks l
				USING unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, sid, token)
				WHERE l.key = r.key AND l.session_id = r.sid AND l.token = r.token
				AND EXISTS (SELECT 1 FROM {{s}}.sessions s WHERE s.id = r.sid AND s.expires_at > now())
				AND set_config('lockd.reason', 'released', true) IS NOT NULL
				RETURNING l.key, l.acquired_at
			), cand AS MATERIALIZED (
				SELECT del.key, w.session_id AS sid
				FROM del CROSS JOIN LATERAL (
					SELECT x.session_id FROM {{s}}.waiters x JOIN {{s}}.sessions s ON s.id = x.session_id
					WHERE x.key = del.key AND s.expires_at > clock_timestamp()
					ORDER BY x.id LIMIT 1
					FOR KEY SHARE OF s
				) w
				WHERE NOT EXISTS (SELECT 1 FROM {{s}}.slots m WHERE m.key = del.key)
				AND NOT EXISTS (SELECT 1 FROM {{s}}.slot_waiters m WHERE m.key = del.key)
				AND NOT EXISTS (SELECT 1 FROM {{s}}.delays d WHERE d.key = del.key AND (d.until > now() OR d.pending_ms IS NOT NULL))
			), ins AS (
				INSERT INTO {{s}}.locks (key, session_id, token)
				SELECT key, sid, nextval({{seq}}) FROM cand ORDER BY key
				ON CONFLICT (key) DO NOTHING
				RETURNING key, session_id, token, acquired_at
			), deq AS (
				DELETE FROM {{s}}.waiters w USING ins WHERE w.key = ins.key AND w.session_id = ins.session_id
				AND set_config('lockd.handover', 'on', true) IS NOT NULL
			), ho AS (
				SELECT ins.key, ins.session_id, ins.token, ins.acquired_at,
					floor(extract(epoch FROM s.expires_at - clock_timestamp()) * 1000000)::bigint AS rem_us
				FROM ins JOIN {{s}}.sessions s ON s.id = ins.session_id
			)
			SELECT del.key, del.acquired_at, ho.session_id, ho.token, ho.acquired_at, ho.rem_us
			FROM del LEFT JOIN ho ON ho.key = del.key`),
		// $1 session ids, sorted and distinct. Never resurrects: an expired
		// row (expires_at <= now()) is not updated, so the session stays
		// dead.
		heartbeatBatch: r.Replace(`UPDATE {{s}}.sessions SET expires_at = now() + ttl_ms * interval '1 millisecond'
			WHERE id = ANY($1::text[]) AND expires_at > now() RETURNING id, ttl_ms`),

		revoke: r.Replace(`DELETE FROM {{s}}.locks
			WHERE key = $1 AND set_config('lockd.reason', 'revoked', true) IS NOT NULL
			RETURNING session_id, token, acquired_at`),
		inspect: r.Replace(`SELECT l.session_id, l.token, l.acquired_at,
			ARRAY(SELECT w.session_id FROM {{s}}.waiters w WHERE w.key = l.key ORDER BY w.id),
			coalesce(s.owner, ''), coalesce(s.labels, '{}'::jsonb), l.value, l.lock_delay_ms
			FROM {{s}}.locks l LEFT JOIN {{s}}.sessions s ON s.id = l.session_id WHERE l.key = $1`),
		// $1 prefix, $2 the first string past every key with the prefix
		// (NULL: none), $3 after, $4 limit. Bytewise order (COLLATE "C").
		list: r.Replace(`SELECT l.key, l.session_id, l.token, l.acquired_at,
			ARRAY(SELECT w.session_id FROM {{s}}.waiters w WHERE w.key = l.key ORDER BY w.id),
			coalesce(s.owner, ''), coalesce(s.labels, '{}'::jsonb), l.value, l.lock_delay_ms
			FROM {{s}}.locks l LEFT JOIN {{s}}.sessions s ON s.id = l.session_id
			WHERE l.key >= $1::text COLLATE "C" AND ($2::text IS NULL OR l.key < $2::text COLLATE "C")
			AND l.key > $3::text COLLATE "C"
			ORDER BY l.key LIMIT $4`),

		// ListSessions (sessionlist.go): $1 after, $2 principal (NULL:
		// any), $3 limit. Live rows only; remaining in whole ms, floored,
		// from the database's now() (later than the call's receipt).
		listSessions: r.Replace(`SELECT s.id, coalesce(s.principal, ''), coalesce(s.owner, ''), coalesce(s.labels, '{}'::jsonb), s.ttl_ms,
			floor(extract(epoch FROM (s.expires_at - now())) * 1000)::bigint,
			(SELECT count(*) FROM {{s}}.locks l WHERE l.session_id = s.id)
			FROM {{s}}.sessions s
			WHERE s.expires_at > now() AND s.id > $1::text COLLATE "C"
			AND ($2::text IS NULL OR coalesce(s.principal, '') = $2::text)
			ORDER BY s.id COLLATE "C" LIMIT $3`),

		reapSelect: r.Replace(`SELECT id FROM {{s}}.sessions WHERE expires_at < now()
			ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED`),
		reapLocks: r.Replace(`SELECT session_id, key, token, acquired_at FROM {{s}}.locks WHERE session_id = ANY($1)
			UNION ALL SELECT session_id, key, token, acquired_at FROM {{s}}.slots WHERE session_id = ANY($1)
			ORDER BY session_id, key`),
		reapDelete: r.Replace(`DELETE FROM {{s}}.sessions WHERE id = ANY($1) AND expires_at < now()`),

		notify: `SELECT pg_notify($1, $2)`,
		// Which of the grants ($1 keys, $2 tokens) still stand: the
		// listener drops events that claim they ended (deliver).
		standing: r.Replace(`SELECT l.key, l.token FROM {{s}}.locks l
			JOIN unnest($1::text[], $2::bigint[]) AS e(key, token) ON l.key = e.key AND l.token = e.token
			UNION ALL SELECT m.key, m.token FROM {{s}}.slots m
			JOIN unnest($1::text[], $2::bigint[]) AS e(key, token) ON m.key = e.key AND m.token = e.token`),
		// Wakes $2, the first waiter of the free key $1, wherever it waits
		// (see grant).
		nudgeHead:  r.Replace(`SELECT pg_notify({{channel}}, json_build_array(json_build_array('dequeued', $1::text, NULL, NULL, $2::text))::text)`),
		notifyMany: `SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) AS p`,
		// Silences the lock delete trigger for the rest of the transaction,
		// which sends those events itself (migration 0002).
		notifiedSelf: `SELECT set_config('lockd.notified', 'on', true)`,

		// SetGrantPolicy: only the current grant of a live session; the
		// maximum hold counts from this statement on the database clock.
		setPolicy: r.Replace(`UPDATE {{s}}.locks SET lock_delay_ms = $4,
			hold_until = CASE WHEN $5::bigint > 0 THEN clock_timestamp() + $5::bigint * interval '1 millisecond' END
			WHERE key = $1 AND session_id = $2 AND token = $3
			AND EXISTS (SELECT 1 FROM {{s}}.sessions WHERE id = $2 AND expires_at > now())`),
		// A pending delay (its end not stamped yet, migration 0013) has
		// all of d left.
		delayLeft: r.Replace(`SELECT greatest(ceil(extract(epoch FROM until - clock_timestamp()) * 1000)::bigint, pending_ms)
			FROM {{s}}.delays WHERE key = $1 AND (until > clock_timestamp() OR pending_ms IS NOT NULL)`),
		// The reaper's maximum-hold revokes: the delete trigger reports
		// reason max_hold and starts lock-delays (migration 0007).
		reapHolds: r.Replace(`DELETE FROM {{s}}.locks WHERE hold_until <= now()
			AND set_config('lockd.reason', 'max_hold', true) IS NOT NULL
			RETURNING session_id, key, token, acquired_at`),
		reapDelays: r.Replace(`DELETE FROM {{s}}.delays WHERE until < now() AND pending_ms IS NULL`),
		// The end of every pending lock-delay (migration 0013): run only as
		// a statement of its own after the deleting transaction's COMMIT
		// returned (or by the reaper), so every row it sees was written by
		// a commit already visible to every session (delay.go). Rows are
		// taken in key order and a row another transaction has locked is
		// skipped: another stamper stamps it, or a new end of the key is
		// writing it and its own stamp (or the next reaper run) follows.
		// So stampers never wait for or deadlock with each other.
		stampDelays: r.Replace(`UPDATE {{s}}.delays d
			SET until = greatest(d.until, clock_timestamp() + d.pending_ms * interval '1 millisecond'), pending_ms = NULL
			WHERE d.pending_ms IS NOT NULL AND d.key IN (SELECT p.key FROM {{s}}.delays p
				WHERE p.pending_ms IS NOT NULL ORDER BY p.key FOR UPDATE SKIP LOCKED)`),
	}
}
