-- 0003: the hash of each session's owner secret (C2 #ct2-ownership), so any
-- replica can check a caller's secret for a session it adopts. The secret
-- itself is never stored. NULL: a session opened by a lockd from before
-- session secrets (newer replicas refuse to act for it).
--
-- {{schema}} is the quoted schema name; the migration runner substitutes it.

ALTER TABLE {{schema}}.sessions ADD COLUMN secret_hash bytea;
