-- 0002: notifications per statement instead of per row; acquired events on
-- INSERT (tokens are drawn in it).
--
-- 0001 sent one NOTIFY per changed row, so closing a session with 10 000
-- locks queued 10 000 notifications. These statement-level triggers read the
-- statement's transition table and send its events several per
-- notification, as a JSON array of events, each event itself an array
-- [kind, key, session, token, next]. Queue events stay per row (a
-- "dequeued" event is [kind, key, null, null, next], alone in its array).
-- next is the key's first waiter after the change (null: none), the only
-- waiter that needs waking.
-- (json_build_array, not json_build_object: the latter costs far more per
-- row.)
--
-- {{schema}} is the quoted schema name and {{channel}} the quoted NOTIFY
-- channel name as a string literal; the migration runner substitutes both.

DROP TRIGGER locks_acquired ON {{schema}}.locks;
DROP TRIGGER locks_deleted ON {{schema}}.locks;
DROP TRIGGER waiters_deleted ON {{schema}}.waiters;
DROP FUNCTION {{schema}}.notify_lock();
DROP FUNCTION {{schema}}.notify_waiter();

-- Each trigger sends the events of its statement in chunks: n events per
-- notification, n = 3800 bytes over the longest event's worst case (every
-- byte of the key a control character, escaped as \u00XX, every byte of the
-- session ids escaped as \", plus 60 bytes for the rest), so no payload
-- reaches PostgreSQL's limit of 8000 bytes. Events of one statement have distinct keys,
-- so the order of the chunks does not matter.

-- Lock events. The acquired event fires when a lock row is inserted with
-- its token: from this migration on, a grant draws its token in the INSERT,
-- under the key's advisory lock (see grant in locks.go), instead of
-- inserting token 0 and setting the token by an UPDATE. A delete reports the
-- reason its transaction set with set_config('lockd.reason', ..., true), or
-- "expired" when none was set: closes, reaps and every other cascade from
-- sessions. A transaction that sends the delete events itself (CloseSession
-- and the reaper, which have the rows anyway) sets lockd.notified to 'on'
-- and the trigger stays silent.
CREATE FUNCTION {{schema}}.notify_locks_acquired() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    SELECT greatest(1, 3800 / (6 * max(octet_length(k.key)) + 2 * max(octet_length(k.session_id)) + 60)) INTO n
    FROM new_locks k;
    PERFORM pg_notify({{channel}}, '[' || string_agg(e.ev, ',') || ']')
    FROM (SELECT json_build_array('acquired', nw.key, nw.session_id, nw.token)::text AS ev,
                 row_number() OVER () AS rn
          FROM new_locks nw
          WHERE nw.token <> 0) e
    GROUP BY (e.rn - 1) / n;
    RETURN NULL;
END
$$;

CREATE FUNCTION {{schema}}.notify_locks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    reason text := coalesce(nullif(current_setting('lockd.reason', true), ''), 'expired');
    n bigint;
BEGIN
    IF current_setting('lockd.notified', true) = 'on' THEN
        RETURN NULL;
    END IF;
    SELECT greatest(1, 3800 / (6 * max(octet_length(k.key)) + 4 * max(octet_length(k.session_id)) + 60)) INTO n
    FROM old_locks k;
    PERFORM pg_notify({{channel}}, '[' || string_agg(e.ev, ',') || ']')
    FROM (SELECT json_build_array(reason, o.key, o.session_id, o.token,
                     (SELECT w.session_id FROM {{schema}}.waiters w WHERE w.key = o.key ORDER BY w.id LIMIT 1))::text AS ev,
                 row_number() OVER () AS rn
          FROM old_locks o) e
    GROUP BY (e.rn - 1) / n;
    RETURN NULL;
END
$$;

CREATE TRIGGER locks_acquired AFTER INSERT ON {{schema}}.locks
    REFERENCING NEW TABLE AS new_locks
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.notify_locks_acquired();
CREATE TRIGGER locks_deleted AFTER DELETE ON {{schema}}.locks
    REFERENCING OLD TABLE AS old_locks
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.notify_locks_deleted();

-- Queue events: a waiter left its key's queue (granted, cancelled, or its
-- session ended), so the next one may now be first. Per row, unlike the lock
-- events: queues are short, and most statements that may dequeue (every
-- grant batch) dequeue nobody, which costs a row trigger nothing.
CREATE FUNCTION {{schema}}.notify_waiter_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({{channel}}, json_build_array(json_build_array('dequeued', OLD.key, NULL, NULL,
        (SELECT w.session_id FROM {{schema}}.waiters w WHERE w.key = OLD.key ORDER BY w.id LIMIT 1)))::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER waiters_deleted AFTER DELETE ON {{schema}}.waiters
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.notify_waiter_deleted();
