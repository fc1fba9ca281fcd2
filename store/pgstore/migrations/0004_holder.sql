-- 0004: holder identity (C2 #ct2-holder, issue #15 §1): the owner string and
-- labels of each session, and the value of each grant. Defaults keep rows of
-- an older lockd valid (no owner, no labels, no value).
--
-- {{schema}} is the quoted schema name; the migration runner substitutes it.

ALTER TABLE {{schema}}.sessions ADD COLUMN owner text NOT NULL DEFAULT '';
ALTER TABLE {{schema}}.sessions ADD COLUMN labels jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE {{schema}}.locks ADD COLUMN value bytea;
