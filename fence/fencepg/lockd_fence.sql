-- The lockd fence for PostgreSQL (docs/contracts/C2.md #ct2-fence-kit).
-- Apply it once in the schema your tables live in (fencepg.Apply does, or
-- psql -f lockd_fence.sql); applying it again changes nothing.
--
-- Per key, lockd_fence keeps the highest fencing token accepted (the
-- high-water mark). lockd_fence_check(key, token), called in the
-- transaction that writes, accepts a token at or above the mark and raises
-- the mark; a lower token raises SQLSTATE LF409 ('lockd_fence: stale
-- token'), which aborts the transaction and so the write. The mark's row
-- stays locked until the transaction ends: writes of one key are fenced in
-- commit order.
--
-- lockd_fence_row() does the same from a trigger on your own table, whose
-- rows carry the key and token; its arguments name those columns:
--
--   CREATE TRIGGER accounts_fence BEFORE INSERT OR UPDATE ON accounts
--     FOR EACH ROW EXECUTE FUNCTION lockd_fence_row('lock_key', 'lock_token');

CREATE TABLE IF NOT EXISTS lockd_fence (
    key        text        PRIMARY KEY,
    token      bigint      NOT NULL CHECK (token > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION lockd_fence_check(p_key text, p_token bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    high bigint;
BEGIN
    IF p_key IS NULL OR p_key = '' OR p_token IS NULL OR p_token <= 0 THEN
        RAISE EXCEPTION 'lockd_fence: invalid key or token (key %, token %)', quote_nullable(p_key), quote_nullable(p_token)
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO lockd_fence AS f (key, token) VALUES (p_key, p_token)
    ON CONFLICT (key) DO UPDATE SET token = excluded.token, updated_at = now()
        WHERE f.token <= excluded.token
    RETURNING f.token INTO high;
    IF NOT FOUND THEN
        -- The row exists with a higher token; ON CONFLICT locked it.
        SELECT f.token INTO high FROM lockd_fence AS f WHERE f.key = p_key;
        RAISE EXCEPTION 'lockd_fence: stale token'
            USING ERRCODE = 'LF409',
                  DETAIL = format('key %s token %s high_water %s', quote_literal(p_key), p_token, high);
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION lockd_fence_row() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r jsonb := to_jsonb(NEW);
BEGIN
    IF TG_NARGS <> 2 THEN
        RAISE EXCEPTION 'lockd_fence_row: want two arguments, the key column and the token column'
            USING ERRCODE = '22023';
    END IF;
    PERFORM lockd_fence_check(r ->> TG_ARGV[0], (r ->> TG_ARGV[1])::bigint);
    RETURN NEW;
END;
$$;
