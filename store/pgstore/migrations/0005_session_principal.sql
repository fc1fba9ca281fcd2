-- 0005: the authenticated principal each session is bound to (C2
-- #ct2-ownership), so any replica can refuse a caller that is not the
-- session's opener. NULL: no principal (an anonymous opener, or a session
-- opened by a lockd from before this migration).
--
-- {{schema}} is the quoted schema name; the migration runner substitutes it.

ALTER TABLE {{schema}}.sessions ADD COLUMN principal text;
