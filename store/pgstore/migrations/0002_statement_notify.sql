-- 0002: notifications per statement instead of per row.
--
-- 0001 sent one NOTIFY per changed row, so closing a session with 10 000
-- locks queued 10 000 notifications. These statement-level triggers read the
-- statement's transition table and send its events as JSON arrays of the
-- same objects ({"kind", "key", "session", "token"}), several events per
-- notification, each payload well under PostgreSQL's 8000-byte limit.
--
-- {{schema}} is the quoted schema name and {{channel}} the quoted NOTIFY
-- channel name as a string literal; the migration runner substitutes both.

DROP TRIGGER locks_acquired ON {{schema}}.locks;
DROP TRIGGER locks_deleted ON {{schema}}.locks;
DROP TRIGGER waiters_deleted ON {{schema}}.waiters;
DROP FUNCTION {{schema}}.notify_lock();
DROP FUNCTION {{schema}}.notify_waiter();

-- notify_events sends events (each a JSON object, in order) as JSON arrays.
-- A notification starts a new array once the events before it reach 4000
-- bytes; one event is at most about 3200 bytes (a 512-byte key of control
-- characters, each escaped as \u00XX), so no payload reaches 8000 bytes.
CREATE FUNCTION {{schema}}.notify_events(events text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    FOR payload IN
        SELECT '[' || string_agg(e.event, ',' ORDER BY e.n) || ']'
        FROM (SELECT t.event, t.n,
                     (sum(octet_length(t.event) + 1) OVER (ORDER BY t.n) - octet_length(t.event) - 1) / 4000 AS chunk
              FROM unnest(events) WITH ORDINALITY AS t(event, n)) e
        GROUP BY e.chunk ORDER BY e.chunk
    LOOP
        PERFORM pg_notify({{channel}}, payload);
    END LOOP;
END
$$;

-- Lock events. The acquired event fires when the granting transaction sets
-- the token (the only UPDATE of locks: from 0 to the real token); a delete
-- reports the reason its transaction set with set_config('lockd.reason',
-- ..., true), or "expired" when none was set: closes, reaps and every other
-- cascade from sessions.
CREATE FUNCTION {{schema}}.notify_locks_acquired() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {{schema}}.notify_events(ARRAY(
        SELECT json_build_object('kind', 'acquired', 'key', n.key, 'session', n.session_id, 'token', n.token)::text
        FROM new_locks n JOIN old_locks o ON o.key = n.key
        WHERE o.token = 0 AND n.token <> 0
        ORDER BY n.key));
    RETURN NULL;
END
$$;

CREATE FUNCTION {{schema}}.notify_locks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    reason text := coalesce(nullif(current_setting('lockd.reason', true), ''), 'expired');
BEGIN
    PERFORM {{schema}}.notify_events(ARRAY(
        SELECT json_build_object('kind', reason, 'key', o.key, 'session', o.session_id, 'token', o.token)::text
        FROM old_locks o
        ORDER BY o.key));
    RETURN NULL;
END
$$;

CREATE TRIGGER locks_acquired AFTER UPDATE ON {{schema}}.locks
    REFERENCING OLD TABLE AS old_locks NEW TABLE AS new_locks
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.notify_locks_acquired();
CREATE TRIGGER locks_deleted AFTER DELETE ON {{schema}}.locks
    REFERENCING OLD TABLE AS old_locks
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.notify_locks_deleted();

-- Queue events: waiters left these keys' queues (granted, cancelled, or
-- their sessions ended), so the next one may now be first. One event per
-- key and statement.
CREATE FUNCTION {{schema}}.notify_waiters_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {{schema}}.notify_events(ARRAY(
        SELECT json_build_object('kind', 'dequeued', 'key', k.key)::text
        FROM (SELECT DISTINCT o.key FROM old_waiters o) k
        ORDER BY k.key));
    RETURN NULL;
END
$$;

CREATE TRIGGER waiters_deleted AFTER DELETE ON {{schema}}.waiters
    REFERENCING OLD TABLE AS old_waiters
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.notify_waiters_deleted();
