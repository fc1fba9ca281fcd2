-- 0011: the hand-over in a plain release (C2 #ct2-release-handover, issue
-- 24). A release now hands the key to its first live waiter in its own
-- commit (queries.go handOver), deleting that waiter's row. The row's
-- dequeued event named the key's next first waiter, as for a waiter that
-- left: that one woke, and spent an attempt to find the key held. Under a
-- hand-over (lockd.handover 'on', set by the hand-over's statement and
-- cleared by the next one) the event names the session granted instead, as
-- 0010 does for slots: a waiter of another instance wakes and its attempt
-- finds the key held; one of the releasing instance was told already.
--
-- {{schema}} is the quoted schema name and {{channel}} the quoted NOTIFY
-- channel name as a string literal; the migration runner substitutes both.

CREATE OR REPLACE FUNCTION {{schema}}.notify_waiter_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify({{channel}}, json_build_array(json_build_array('dequeued', OLD.key, NULL, NULL,
        CASE WHEN current_setting('lockd.handover', true) = 'on' THEN OLD.session_id
             ELSE (SELECT w.session_id FROM {{schema}}.waiters w WHERE w.key = OLD.key ORDER BY w.id LIMIT 1) END))::text);
    RETURN NULL;
END
$$;
