-- ratekeeper PostgreSQL store: the schema, the state table and the shared helpers.
--
-- Placeholders, each a name between two at-signs, replaced by ratekeeper.stores.postgres.sansio
-- before running (names checked to be plain identifiers): the schema, the state table, and
-- "UNLOGGED" or nothing (an UNLOGGED table skips the WAL: faster, emptied after a crash).
--
-- One row per (rule, key): key = wire.storage_key(prefix, plan, key); state holds every
-- limit of the rule in one numeric[] (exact integers of any size: GCRA keeps times in
-- units of 1/d µs, beyond bigint); leases holds the lease ids of a concurrency rule;
-- expires_at (wall-clock µs since the epoch) is when the state is whole again, rounded
-- up to a second and moved a step of 10 s further than needed, so that a busy key's updates
-- rarely change an indexed column (HOT updates); rows past it are deleted by the bounded
-- sweep (@table@_sweep). A row may live that step (plus a grace second) past its whole time.
--
-- Every statement is idempotent: running this file again changes nothing.

CREATE SCHEMA IF NOT EXISTS @schema@;

CREATE @unlogged@ TABLE IF NOT EXISTS @schema@.@table@ (
    key        text PRIMARY KEY,
    state      numeric[],
    leases     text[],
    expires_at bigint NOT NULL
) WITH (fillfactor = 80);  -- room on each page for HOT updates

CREATE INDEX IF NOT EXISTS @table@_expires_at ON @schema@.@table@ (expires_at);

-- One key's working copy inside a call (PL/pgSQL arrays of it).
DO $$
BEGIN
    IF to_regtype('@schema@.rk_slot') IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_attribute WHERE attrelid = (SELECT typrelid FROM pg_type WHERE oid = to_regtype('@schema@.rk_slot'))
        AND attname = 'expires'
    ) THEN
        DROP TYPE @schema@.rk_slot;  -- an older version's: no column uses it
    END IF;
    IF to_regtype('@schema@.rk_slot') IS NULL THEN
        CREATE TYPE @schema@.rk_slot AS (
            state  numeric[],   -- the state being decided on (NULL: never used or whole)
            leases text[],
            dirty  boolean,     -- must be written back
            fresh  boolean,     -- the row is this call's placeholder (insert or delete it)
            life   bigint,      -- µs from now until the written state is whole
            row_id tid,         -- the locked row
            expires bigint      -- its expires_at
        );
    END IF;
END
$$;

-- Python's a // b for b > 0 (floor division, also for negative a).
CREATE OR REPLACE FUNCTION @schema@.rk_fdiv(a numeric, b numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN a < 0 AND mod(a, b) <> 0 THEN div(a, b) - 1 ELSE div(a, b) END $$;

-- -(-a // b): ceil(a / b) for b > 0 (base.ceil_div).
CREATE OR REPLACE FUNCTION @schema@.rk_cdiv(a numeric, b numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN a > 0 AND mod(a, b) <> 0 THEN div(a, b) + 1 ELSE div(a, b) END $$;

-- base.later: whether retry time a is later than b (-1 = never, the latest).
CREATE OR REPLACE FUNCTION @schema@.rk_later(a numeric, b numeric) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN a = -1 THEN b <> -1 ELSE b <> -1 AND a > b END $$;
