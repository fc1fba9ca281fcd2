-- 0007: lock-delay and maximum hold (issue 15 §5, docs/contracts/C2.md
-- #ct2-delay). A grant's policy lives in its lock row (set by
-- SetGrantPolicy right after the grant); a running lock-delay lives in a
-- delays row, which every grant checks.
--
-- {{schema}} is the quoted schema name and {{channel}} the quoted NOTIFY
-- channel name as a string literal; the migration runner substitutes both.

ALTER TABLE {{schema}}.locks
    ADD COLUMN lock_delay_ms bigint NOT NULL DEFAULT 0 CHECK (lock_delay_ms >= 0),
    -- Set from the database clock only; the reaper revokes the grant once
    -- it has passed.
    ADD COLUMN hold_until timestamptz;
CREATE INDEX locks_hold_until_idx ON {{schema}}.locks (hold_until) WHERE hold_until IS NOT NULL;

-- A key that no grant may take before until (the database clock).
CREATE TABLE {{schema}}.delays (
    key   text COLLATE "C" PRIMARY KEY,
    until timestamptz NOT NULL
);

-- Every delete of a lock row with a lock-delay starts the delay, in the
-- deleting transaction, unless the end is voluntary: a release (lockd.reason
-- 'released') or CloseSession (lockd.voluntary 'on'). So expiry (reaper,
-- ExpireSession), revoke and maximum hold — and any cascade — start it,
-- whoever deletes the row.
CREATE FUNCTION {{schema}}.start_lock_delays() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('lockd.reason', true) = 'released' OR current_setting('lockd.voluntary', true) = 'on' THEN
        RETURN NULL;
    END IF;
    INSERT INTO {{schema}}.delays (key, until)
    SELECT o.key, clock_timestamp() + o.lock_delay_ms * interval '1 millisecond'
    FROM old_locks o WHERE o.lock_delay_ms > 0
    ON CONFLICT (key) DO UPDATE SET until = greatest({{schema}}.delays.until, EXCLUDED.until);
    RETURN NULL;
END
$$;

CREATE TRIGGER locks_delay AFTER DELETE ON {{schema}}.locks
    REFERENCING OLD TABLE AS old_locks
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.start_lock_delays();
