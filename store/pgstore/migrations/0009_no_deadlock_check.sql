-- 0009: a waiter's opt-out of deadlock refusal (C2 #ct2-deadlock, issue 26
-- §3). Every replica's detector reads it with the place: an opted-out wait
-- counts in the wait-for graph but is never the one refused.
--
-- {{schema}} is the quoted schema name; the migration runner substitutes it.

ALTER TABLE {{schema}}.waiters ADD COLUMN no_deadlock_check boolean NOT NULL DEFAULT false;
