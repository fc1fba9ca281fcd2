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

-- slot_admissible names the waiters of key k that its holders admit now,
-- as store.Admit decides (C2 #ct2-multi): semaphore, the first lim - holders
-- in line; read/write, the leading shared waiters when no exclusive grant
-- holds, or the first waiter alone if it is exclusive and nobody holds. At
-- most 16 (the next grants name the rest: each grant's dequeue calls this
-- again). '-' when it admits nobody.
CREATE FUNCTION {{schema}}.slot_admissible(k text) RETURNS text LANGUAGE sql STABLE AS $$
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
