-- 0001: sessions, locks, waiters, the fencing-token sequence, and the
-- triggers that report lock and queue changes through NOTIFY.
--
-- {{schema}} is the quoted schema name and {{channel}} the quoted NOTIFY
-- channel name as a string literal; the migration runner substitutes both.

CREATE TABLE {{schema}}.sessions (
    id         text        PRIMARY KEY,
    ttl_ms     bigint      NOT NULL CHECK (ttl_ms > 0),
    -- Set from the database's now() only. A session whose expires_at is not
    -- in the future is dead, whether or not the reaper has deleted it yet.
    expires_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sessions_expires_at_idx ON {{schema}}.sessions (expires_at);

-- Fencing tokens. Never reset and touched by no cascade, so tokens are never
-- reused: not after a reap, not after a lockd restart.
CREATE SEQUENCE {{schema}}.fencing_token AS bigint MINVALUE 1 NO CYCLE;

CREATE TABLE {{schema}}.locks (
    -- COLLATE "C": keys order and compare bytewise, as Go strings do.
    key         text COLLATE "C" PRIMARY KEY,
    session_id  text        NOT NULL REFERENCES {{schema}}.sessions (id) ON DELETE CASCADE,
    -- 0 only inside the granting transaction, which sets the real token
    -- after the row is its own (see grant in locks.go).
    token       bigint      NOT NULL DEFAULT 0,
    acquired_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lock_entry_session_idx ON {{schema}}.locks (session_id);

CREATE TABLE {{schema}}.waiters (
    id          bigserial   PRIMARY KEY, -- FIFO order within a key
    key         text COLLATE "C" NOT NULL,
    session_id  text        NOT NULL REFERENCES {{schema}}.sessions (id) ON DELETE CASCADE,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (key, session_id)
);
CREATE INDEX waiters_key_id_idx ON {{schema}}.waiters (key, id);
CREATE INDEX waiters_session_idx ON {{schema}}.waiters (session_id);

-- Lock events. The acquired event fires when the granting transaction sets
-- the token; a delete reports the reason its transaction set with
-- set_config('lockd.reason', ..., true), or "expired" when none was set:
-- closes, reaps and every other cascade from sessions.
CREATE FUNCTION {{schema}}.notify_lock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        PERFORM pg_notify({{channel}}, json_build_object(
            'kind', 'acquired', 'key', NEW.key, 'session', NEW.session_id, 'token', NEW.token)::text);
    ELSE
        PERFORM pg_notify({{channel}}, json_build_object(
            'kind', coalesce(nullif(current_setting('lockd.reason', true), ''), 'expired'),
            'key', OLD.key, 'session', OLD.session_id, 'token', OLD.token)::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER locks_acquired AFTER UPDATE OF token ON {{schema}}.locks
    FOR EACH ROW WHEN (OLD.token = 0 AND NEW.token <> 0)
    EXECUTE FUNCTION {{schema}}.notify_lock();
CREATE TRIGGER locks_deleted AFTER DELETE ON {{schema}}.locks
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.notify_lock();

-- Queue events: a waiter left its queue (granted, cancelled, or its session
-- ended), so the next one may now be first.
CREATE FUNCTION {{schema}}.notify_waiter() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({{channel}}, json_build_object(
        'kind', 'dequeued', 'key', OLD.key, 'session', OLD.session_id)::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER waiters_deleted AFTER DELETE ON {{schema}}.waiters
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.notify_waiter();
