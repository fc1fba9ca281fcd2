-- 0010: a slot release hands the freed slot (or a writer's end) to the
-- waiters it admits in the release's own commit (C2 #ct2-multi, "Hand-over
-- in the release"; issue 24). Until 0009 the release only deleted the slot
-- and named the admitted waiters in its event; each then took its slot with
-- an attempt of its own, after the NOTIFY reached its server: the slot sat
-- empty for a notification's delivery plus one attempt (queued behind
-- other attempts on the key's advisory lock), at most 2 of 4 slots held at
-- once in lockd bench's semaphore scenario.
--
-- {{schema}} is the quoted schema name and {{channel}} the quoted NOTIFY
-- channel name as a string literal; the migration runner substitutes both.

-- slot_handover grants key k to its waiters in queue order while the
-- holders admit the next one (store.Admit: semaphore, fewer than lim
-- holders; exclusive, no holder; shared, no exclusive holder), each a slots
-- row with its own token drawn under the key's lock, and takes them out of
-- the queue. The caller holds the key's advisory lock and has removed the
-- waiters of dead sessions (slot_release). A waiter whose session row is
-- going (the reaper deletes it meanwhile) is skipped; the cascade takes its
-- row. Returns how many it granted.
CREATE FUNCTION {{schema}}.slot_handover(k text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    w record;
    n bigint;
    excl boolean;
    granted integer := 0;
BEGIN
    PERFORM set_config('lockd.handover', 'on', true);
    SELECT count(*), coalesce(bool_or(o.mode = 1), false) INTO n, excl FROM {{schema}}.slots o WHERE o.key = k;
    FOR w IN SELECT x.session_id, x.mode, x.lim FROM {{schema}}.slot_waiters x WHERE x.key = k ORDER BY x.id LOOP
        EXIT WHEN CASE w.mode WHEN 0 THEN n >= w.lim WHEN 1 THEN n > 0 ELSE excl END;
        -- The session row stays as checked until commit (see slot_attempt).
        PERFORM 1 FROM {{schema}}.sessions s WHERE s.id = w.session_id AND s.expires_at > now() FOR KEY SHARE;
        CONTINUE WHEN NOT FOUND;
        INSERT INTO {{schema}}.slots (key, session_id, token, mode, lim)
        VALUES (k, w.session_id, nextval('{{schema}}.fencing_token'), w.mode, w.lim);
        DELETE FROM {{schema}}.slot_waiters x WHERE x.key = k AND x.session_id = w.session_id;
        n := n + 1;
        excl := excl OR w.mode = 1;
        granted := granted + 1;
    END LOOP;
    PERFORM set_config('lockd.handover', '', true);
    RETURN granted;
END
$$;

-- A waiter the hand-over grants leaves the queue with a dequeued event that
-- names it: it wakes, and its next attempt finds its slot held (the
-- released event names only the first 16 it admits).
CREATE OR REPLACE FUNCTION {{schema}}.notify_slot_waiter_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({{channel}}, json_build_array(json_build_array('dequeued', OLD.key, NULL, NULL,
        CASE WHEN current_setting('lockd.handover', true) = 'on' THEN OLD.session_id
             WHEN OLD.key = current_setting('lockd.keylocked', true) THEN {{schema}}.slot_admissible(OLD.key) END))::text);
    RETURN NULL;
END
$$;

-- slot_release deletes the slot (k, sid, tok) of a live session under the
-- key's lock and hands over to the waiters the release admits, in one
-- statement; it returns the slot's acquired_at, NULL when it is not the
-- current grant (ErrNotOwner). The waiters of dead sessions leave the
-- queue first, so that the released event names exactly the waiters the
-- hand-over grants (they learn their grant from it: their next attempt
-- finds it held).
CREATE OR REPLACE FUNCTION {{schema}}.slot_release(lock bigint, k text, sid text, tok bigint) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(lock);
    PERFORM set_config('lockd.keylocked', k, true);
    PERFORM set_config('lockd.reason', 'released', true);
    IF NOT EXISTS (SELECT 1 FROM {{schema}}.slots o WHERE o.key = k AND o.session_id = sid AND o.token = tok)
       OR NOT EXISTS (SELECT 1 FROM {{schema}}.sessions x WHERE x.id = sid AND x.expires_at > now()) THEN
        RETURN NULL;
    END IF;
    DELETE FROM {{schema}}.slot_waiters x WHERE x.key = k
        AND NOT EXISTS (SELECT 1 FROM {{schema}}.sessions s WHERE s.id = x.session_id AND s.expires_at > now());
    DELETE FROM {{schema}}.slots o
    WHERE o.key = k AND o.session_id = sid AND o.token = tok
    RETURNING o.acquired_at INTO at;
    IF at IS NOT NULL THEN
        PERFORM {{schema}}.slot_handover(k);
    END IF;
    RETURN at;
END
$$;
