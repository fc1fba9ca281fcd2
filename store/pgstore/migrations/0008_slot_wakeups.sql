-- 0008: a change of a semaphore's or read/write lock's slots or queue wakes
-- the waiters it may admit, not every waiter of the key (issue 24). In 0006
-- every slot delete and every waiter leaving woke all local waiters of the
-- key; with 64 waiters each release cost 64 attempts, serialised on the
-- key's advisory lock ahead of the one that could take the slot (15.7
-- acquisitions/s where the raw recipe made 697).
--
-- The events keep their format ([kind, key, session, token, next]); next
-- now names the waiters to wake, space-separated (session ids have no
-- spaces, store.ValidateSessionID), or '-' for none, and stays NULL (wake
-- every local waiter) unless the deleting transaction holds the key's
-- advisory lock and says so with lockd.keylocked = the key. Under the key
-- lock nobody else grants, queues or releases the key (every grant and
-- release of a slot takes it first), so the queue and holders the trigger
-- reads are the ones the woken waiters will find; changes made without it
-- (a session's end cascading, a waiter leaving on a timeout, a revoke) keep
-- waking everyone, after their own commit.
--
-- {{schema}} is the quoted schema name and {{channel}} the quoted NOTIFY
-- channel name as a string literal; the migration runner substitutes both.

-- slot_verdict is store.Admit (C2 #ct2-multi) for session sid asking key k
-- with mode m and limit l, from the key's slots and queue: 'mismatch' when
-- a holder or waiter is of another kind; 'wait' for a request not queued
-- while anyone is; else 'grant' when it fits with the holders and every
-- waiter ahead of it (semaphore: fewer than l in all; exclusive: nobody;
-- shared: no exclusive one), 'wait' otherwise.
CREATE FUNCTION {{schema}}.slot_verdict(k text, sid text, m smallint, l integer) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- plpgsql, not sql: its plan is cached per connection (a SQL function's
    -- is made again at every call).
    RETURN (
    WITH q AS (SELECT w.session_id, w.mode, w.lim, row_number() OVER (ORDER BY w.id) AS rn
               FROM {{schema}}.slot_waiters w WHERE w.key = k),
         me AS (SELECT min(q.rn) AS rn FROM q WHERE q.session_id = sid),
         h AS (SELECT count(*) AS n, coalesce(bool_or(o.mode = 1), false) AS excl,
                      coalesce(bool_or(o.lim <> l OR (o.mode <> 0) <> (m <> 0)), false) AS other
               FROM {{schema}}.slots o WHERE o.key = k),
         a AS (SELECT count(*) FILTER (WHERE q.rn < coalesce(me.rn, 0)) AS n,
                      coalesce(bool_or(q.mode = 1) FILTER (WHERE q.rn < coalesce(me.rn, 0)), false) AS excl,
                      count(*) AS len,
                      coalesce(bool_or(q.lim <> l OR (q.mode <> 0) <> (m <> 0)), false) AS other
               FROM q, me)
    SELECT CASE
        WHEN h.other OR a.other THEN 'mismatch'
        WHEN me.rn IS NULL AND a.len > 0 THEN 'wait'
        WHEN m = 0 THEN CASE WHEN h.n + a.n >= l THEN 'wait' ELSE 'grant' END
        WHEN m = 1 THEN CASE WHEN h.n > 0 OR a.n > 0 THEN 'wait' ELSE 'grant' END
        ELSE CASE WHEN h.excl OR a.excl THEN 'wait' ELSE 'grant' END
    END
    FROM me, h, a);
END
$$;

-- slot_admissible names the waiters of key k that its holders admit now,
-- as slot_verdict decides for each (one query: the queue is read once):
-- semaphore, the first lim - holders in line; read/write, the leading
-- shared waiters when no exclusive grant holds, or the first waiter alone
-- if it is exclusive and nobody holds. Among the first 16 (the next grants
-- name the rest: each grant's dequeue calls this again); '-' for none.
-- pgstore.TestSlotAdmissibleMatchesAdmit holds both to store.Admit.
CREATE FUNCTION {{schema}}.slot_admissible(k text) RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
    SELECT coalesce(string_agg(q.session_id, ' ' ORDER BY q.rn), '-')
    FROM (SELECT count(*) AS n, coalesce(bool_or(mode = 1), false) AS excl
          FROM {{schema}}.slots WHERE key = k) h,
         (SELECT w.session_id, w.mode, w.lim,
                 row_number() OVER (ORDER BY w.id) AS rn,
                 count(*) FILTER (WHERE w.mode = 1) OVER (ORDER BY w.id) AS excl_upto
          FROM {{schema}}.slot_waiters w WHERE w.key = k) q
    WHERE q.rn <= 16 AND CASE
        WHEN q.mode = 0 THEN q.rn <= q.lim - h.n
        WHEN h.excl THEN false
        WHEN q.mode = 1 THEN h.n = 0 AND q.rn = 1
        ELSE q.excl_upto = 0
    END);
END
$$;

-- slot_attempt is one attempt of a semaphore slot or read/write side, in
-- one statement (issue 24: it was nine round trips under the key's lock):
-- under the key's advisory lock (lock, the hash keyLock takes for k), it
-- answers outcome 1 granted (a slots row with a token drawn under the lock,
-- as every grant of the key), 2 held (the session's own slot), 3 busy
-- (queued when wait), 4 dead (the session is not live) or 5 mismatch, with
-- the grant's token and time and the session's remaining lifetime in µs.
-- Every outcome but busy leaves the queue. lockd.keylocked lets the slot
-- triggers name the waiters a change admits.
CREATE FUNCTION {{schema}}.slot_attempt(lock bigint, k text, sid text, m smallint, l integer, wait boolean,
    OUT outcome smallint, OUT token bigint, OUT acquired_at timestamptz, OUT remaining_us bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock);
    PERFORM set_config('lockd.keylocked', k, true);
    -- The session row stays as checked until commit (see grantCheck).
    SELECT floor(extract(epoch FROM s.expires_at - now()) * 1000000)::bigint INTO remaining_us
    FROM {{schema}}.sessions s WHERE s.id = sid FOR KEY SHARE;
    IF NOT FOUND OR remaining_us <= 0 THEN
        outcome := 4;
    ELSE
        SELECT o.token, o.acquired_at INTO token, acquired_at FROM {{schema}}.slots o
        WHERE o.key = k AND o.session_id = sid;
        IF FOUND THEN
            outcome := 2;
        ELSIF EXISTS (SELECT 1 FROM {{schema}}.locks x WHERE x.key = k)
           OR EXISTS (SELECT 1 FROM {{schema}}.waiters x WHERE x.key = k) THEN
            outcome := 5;
        ELSE
            CASE {{schema}}.slot_verdict(k, sid, m, l)
            WHEN 'mismatch' THEN
                outcome := 5;
            WHEN 'grant' THEN
                INSERT INTO {{schema}}.slots AS o (key, session_id, token, mode, lim)
                VALUES (k, sid, nextval('{{schema}}.fencing_token'), m, l)
                RETURNING o.token, o.acquired_at INTO token, acquired_at;
                outcome := 1;
            ELSE
                outcome := 3;
                IF wait THEN
                    INSERT INTO {{schema}}.slot_waiters (key, session_id, mode, lim) VALUES (k, sid, m, l)
                    ON CONFLICT (key, session_id) DO NOTHING;
                END IF;
                RETURN;
            END CASE;
        END IF;
    END IF;
    DELETE FROM {{schema}}.slot_waiters x WHERE x.key = k AND x.session_id = sid;
END
$$;

-- slot_release deletes the slot (k, sid, tok) of a live session under the
-- key's lock, in one statement, and returns its acquired_at; NULL when it
-- is not the current grant (ErrNotOwner). Its released event names the
-- waiters the release admits.
CREATE FUNCTION {{schema}}.slot_release(lock bigint, k text, sid text, tok bigint) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(lock);
    PERFORM set_config('lockd.keylocked', k, true);
    PERFORM set_config('lockd.reason', 'released', true);
    DELETE FROM {{schema}}.slots o
    WHERE o.key = k AND o.session_id = sid AND o.token = tok
      AND EXISTS (SELECT 1 FROM {{schema}}.sessions x WHERE x.id = sid AND x.expires_at > now())
    RETURNING o.acquired_at INTO at;
    RETURN at;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.notify_slots_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    reason text := coalesce(nullif(current_setting('lockd.reason', true), ''), 'expired');
    locked text := current_setting('lockd.keylocked', true);
    n bigint;
BEGIN
    IF current_setting('lockd.notified', true) = 'on' THEN
        RETURN NULL;
    END IF;
    -- A named next adds up to 16 session ids to an event.
    SELECT greatest(1, 3800 / (6 * max(octet_length(k.key)) + 18 * max(octet_length(k.session_id)) + 80)) INTO n
    FROM old_slots k;
    PERFORM pg_notify({{channel}}, '[' || string_agg(e.ev, ',') || ']')
    FROM (SELECT json_build_array(reason, o.key, o.session_id, o.token,
                     CASE WHEN o.key = locked THEN {{schema}}.slot_admissible(o.key) END)::text AS ev,
                 row_number() OVER () AS rn
          FROM old_slots o) e
    GROUP BY (e.rn - 1) / n;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.notify_slot_waiter_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({{channel}}, json_build_array(json_build_array('dequeued', OLD.key, NULL, NULL,
        CASE WHEN OLD.key = current_setting('lockd.keylocked', true) THEN {{schema}}.slot_admissible(OLD.key) END))::text);
    RETURN NULL;
END
$$;
