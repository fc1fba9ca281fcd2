-- 0013: a lock-delay counts from the moment other sessions see the end
-- (issue 21, docs/contracts/C2.md #ct2-delay). 0012 stamped until at the
-- start of the deleting transaction's COMMIT (a deferred trigger); the rest
-- of the commit — queueing its NOTIFYs, flushing the commit record, a
-- synchronous standby — came after that stamp, and a session that still
-- saw the holder during it could be granted the key less than d after.
--
-- Now a delays row whose pending_ms is set is *pending*: every grant path
-- treats it as busy, whatever until says. The statement trigger of 0012
-- (start_lock_delays) still writes it, at the DELETE, with pending_ms = d.
-- The deferred trigger that cleared pending_ms at COMMIT goes: the row
-- stays pending through the whole commit, and its end is stamped
-- (until = greatest(until, clock_timestamp() + pending_ms), pending_ms =
-- NULL) only by a statement that sees it — so after the commit is visible:
-- the ending call right after its COMMIT returned, or the reaper of any
-- instance (pgstore's stampDelays). The reaper's delete of run-out delays
-- leaves pending rows alone.
--
-- {{schema}} is the quoted schema name and {{channel}} the quoted NOTIFY
-- channel name as a string literal; the migration runner substitutes both.

DROP TRIGGER delays_stamp_at_commit ON {{schema}}.delays;
DROP FUNCTION {{schema}}.stamp_lock_delay();

CREATE INDEX delays_pending_idx ON {{schema}}.delays (key) WHERE pending_ms IS NOT NULL;
