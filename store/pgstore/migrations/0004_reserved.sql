-- 0004: reserved. A placeholder so that the versions stay 1..n without gaps
-- on this branch: migration 0004 belongs to another change being merged at
-- the same time (holder identity). Delete this file when that change's 0004
-- is merged; keep it otherwise. It changes nothing.
SELECT 1;
