-- 0006: semaphores and read/write locks (C2 #ct2-multi, issue #15 §3-4).
-- A key of either kind has its holders in slots (one row per holder, each
-- with its own token from the one fencing_token sequence) and its queue in
-- slot_waiters; a plain lock keeps using locks and waiters. Every grant of
-- either kind takes the key's advisory lock first, and each kind refuses a
-- key the other kind has rows for (ErrLimitMismatch), so a key is never
-- held both ways. Slots cascade from their session like locks do.
--
-- {{schema}} is the quoted schema name and {{channel}} the quoted NOTIFY
-- channel name as a string literal; the migration runner substitutes both.

CREATE TABLE {{schema}}.slots (
    key         text COLLATE "C" NOT NULL,
    session_id  text        NOT NULL REFERENCES {{schema}}.sessions (id) ON DELETE CASCADE,
    token       bigint      NOT NULL,
    -- 0: a semaphore slot; 1: exclusive, 2: shared (store.Mode).
    mode        smallint    NOT NULL,
    lim         integer     NOT NULL CHECK (lim >= 1),
    acquired_at timestamptz NOT NULL DEFAULT now(),
    value       bytea,
    PRIMARY KEY (key, session_id)
);
CREATE INDEX slots_session_idx ON {{schema}}.slots (session_id);

CREATE TABLE {{schema}}.slot_waiters (
    id          bigserial   PRIMARY KEY, -- FIFO order within a key
    key         text COLLATE "C" NOT NULL,
    session_id  text        NOT NULL REFERENCES {{schema}}.sessions (id) ON DELETE CASCADE,
    mode        smallint    NOT NULL,
    lim         integer     NOT NULL CHECK (lim >= 1),
    UNIQUE (key, session_id)
);
CREATE INDEX slot_waiters_key_id_idx ON {{schema}}.slot_waiters (key, id);
CREATE INDEX slot_waiters_session_idx ON {{schema}}.slot_waiters (session_id);

-- The end of a slot, in the format of locks_deleted (0002), with no next
-- waiter: every local waiter of the key is woken and decides again. Silent
-- when the transaction sends the events itself (lockd.notified).
CREATE FUNCTION {{schema}}.notify_slots_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    reason text := coalesce(nullif(current_setting('lockd.reason', true), ''), 'expired');
    n bigint;
BEGIN
    IF current_setting('lockd.notified', true) = 'on' THEN
        RETURN NULL;
    END IF;
    SELECT greatest(1, 3800 / (6 * max(octet_length(k.key)) + 2 * max(octet_length(k.session_id)) + 60)) INTO n
    FROM old_slots k;
    PERFORM pg_notify({{channel}}, '[' || string_agg(e.ev, ',') || ']')
    FROM (SELECT json_build_array(reason, o.key, o.session_id, o.token, NULL)::text AS ev,
                 row_number() OVER () AS rn
          FROM old_slots o) e
    GROUP BY (e.rn - 1) / n;
    RETURN NULL;
END
$$;

CREATE TRIGGER slots_deleted AFTER DELETE ON {{schema}}.slots
    REFERENCING OLD TABLE AS old_slots
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.notify_slots_deleted();

-- A waiter left (granted, cancelled, session ended): every local waiter of
-- the key decides again.
CREATE FUNCTION {{schema}}.notify_slot_waiter_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({{channel}}, json_build_array(json_build_array('dequeued', OLD.key, NULL, NULL, NULL))::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER slot_waiters_deleted AFTER DELETE ON {{schema}}.slot_waiters
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.notify_slot_waiter_deleted();
