-- 0012: a lock-delay counts from the deleting transaction's commit (issue 21,
-- docs/contracts/C2.md #ct2-delay). 0007's statement trigger stamped
-- until = clock_timestamp() + d at the DELETE, but other sessions see the
-- grant end only at the COMMIT, which comes later (the rest of an expiring
-- or reaping transaction, its NOTIFYs, the WAL flush: tens of ms under
-- load), so the delay they observed was shorter than d by that gap.
--
-- The statement trigger still decides, at the DELETE, whether the end is
-- voluntary (lockd.reason / lockd.voluntary are read where they are set)
-- and writes the delays row; it now also records the delay still to start,
-- pending_ms. A deferred constraint trigger on delays, which runs at COMMIT
-- after every statement of the transaction, re-stamps
-- until = greatest(until, clock_timestamp() + pending_ms) and clears
-- pending_ms (its WHEN skips that update, so it does not fire again).
-- Overlapping delays keep the greatest: ON CONFLICT keeps the greater until
-- and the greater pending_ms.
--
-- {{schema}} is the quoted schema name and {{channel}} the quoted NOTIFY
-- channel name as a string literal; the migration runner substitutes both.

ALTER TABLE {{schema}}.delays ADD COLUMN pending_ms bigint CHECK (pending_ms > 0);

CREATE OR REPLACE FUNCTION {{schema}}.start_lock_delays() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('lockd.reason', true) = 'released' OR current_setting('lockd.voluntary', true) = 'on' THEN
        RETURN NULL;
    END IF;
    INSERT INTO {{schema}}.delays (key, until, pending_ms)
    SELECT o.key, clock_timestamp() + o.lock_delay_ms * interval '1 millisecond', o.lock_delay_ms
    FROM old_locks o WHERE o.lock_delay_ms > 0
    ON CONFLICT (key) DO UPDATE SET until = greatest({{schema}}.delays.until, EXCLUDED.until),
        pending_ms = greatest({{schema}}.delays.pending_ms, EXCLUDED.pending_ms);
    RETURN NULL;
END
$$;

CREATE FUNCTION {{schema}}.stamp_lock_delay() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {{schema}}.delays
    SET until = greatest(until, clock_timestamp() + pending_ms * interval '1 millisecond'), pending_ms = NULL
    WHERE key = NEW.key AND pending_ms IS NOT NULL;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER delays_stamp_at_commit AFTER INSERT OR UPDATE ON {{schema}}.delays
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.pending_ms IS NOT NULL)
    EXECUTE FUNCTION {{schema}}.stamp_lock_delay();
