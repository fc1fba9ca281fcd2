-- 0014: semaphore and read/write waits in the deadlock detector's graph
-- (C2 #ct2-deadlock, 2026-12-07, issue 26). A slot waiter's opt-out of
-- deadlock refusal is stored with its place, as a plain waiter's is (0009),
-- and written by the queueing attempt itself; and slot waiters draw their
-- ids from the plain waiters' sequence, so that the ids of both tables
-- order every place by age (the victim is the youngest wait of a deadlocked
-- set, whatever its kind). The sequence is first moved past every id either
-- table has, so each queue's ids keep increasing.
--
-- {{schema}} is the quoted schema name; the migration runner substitutes it.

ALTER TABLE {{schema}}.slot_waiters ADD COLUMN no_deadlock_check boolean NOT NULL DEFAULT false;

SELECT setval('{{schema}}.waiters_id_seq', greatest(
    (SELECT last_value FROM {{schema}}.waiters_id_seq),
    (SELECT last_value FROM {{schema}}.slot_waiters_id_seq),
    (SELECT coalesce(max(id), 0) FROM {{schema}}.slot_waiters),
    (SELECT coalesce(max(id), 0) FROM {{schema}}.waiters), 1));
ALTER TABLE {{schema}}.slot_waiters ALTER COLUMN id SET DEFAULT nextval('{{schema}}.waiters_id_seq');

-- slot_attempt (0008) with nodl, the caller's store.NoDeadlockCheck, stored
-- with a new place and with a place it finds (a later attempt of the same
-- call passes the same value). Its default keeps a caller of the 0008 form
-- (a server from before this migration) working: its places check.
DROP FUNCTION {{schema}}.slot_attempt(bigint, text, text, smallint, integer, boolean);
CREATE FUNCTION {{schema}}.slot_attempt(lock bigint, k text, sid text, m smallint, l integer, wait boolean,
    nodl boolean DEFAULT false,
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
                    INSERT INTO {{schema}}.slot_waiters AS w (key, session_id, mode, lim, no_deadlock_check)
                    VALUES (k, sid, m, l, nodl)
                    ON CONFLICT (key, session_id) DO UPDATE SET no_deadlock_check = EXCLUDED.no_deadlock_check
                    WHERE w.no_deadlock_check IS DISTINCT FROM EXCLUDED.no_deadlock_check;
                END IF;
                RETURN;
            END CASE;
        END IF;
    END IF;
    DELETE FROM {{schema}}.slot_waiters x WHERE x.key = k AND x.session_id = sid;
END
$$;
