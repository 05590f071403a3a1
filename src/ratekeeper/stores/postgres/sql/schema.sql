-- ratekeeper PostgreSQL store: the schema, the state table and the shared helpers.
--
-- Placeholders, each a name between two at-signs, replaced by ratekeeper.stores.postgres.schema
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

-- The sealed segments of the sliding logs (sliding_window_log.sql): per storage key, runs of
-- at most SEGMENT entries, immutable once inserted. upto is the running total (the cost
-- admitted since the log began) at the segment's last entry, so upto increases strictly
-- along a key's log; before is the running total before its first entry (or the log's base,
-- if larger); entry j was admitted at first_t + offs[j] and brings the running total to
-- upto - rels[n] + rels[j] (rels[1] = 0; a segment is cut early rather than let an offset
-- or a rel pass int4); rels is NULL when every entry's cost is 1 (rels[j] = j - 1 then: most
-- limits charge 1 per request). offs and rels are packed in as few bytes per value as the
-- segment's largest needs (rk_pack, sliding_window_log.sql): 2 for entries 1 ms apart. Rows are written only by a call holding the key's state row, and
-- deleted with it. Created with the state table's persistence (after a crash, an
-- UNLOGGED table is emptied: the two must be emptied together).
DO $$
BEGIN
    IF to_regclass('@schema@.@table@_log') IS NULL THEN
        EXECUTE format(
            'CREATE %s TABLE @schema@.@table@_log ('
            'key text NOT NULL, upto numeric NOT NULL, before numeric NOT NULL, first_t bigint NOT NULL, '
            'last_t bigint NOT NULL, offs bytea NOT NULL, rels bytea, PRIMARY KEY (key, upto))',
            CASE (SELECT relpersistence FROM pg_class WHERE oid = '@schema@.@table@'::regclass)
                WHEN 'u' THEN 'UNLOGGED' ELSE '' END);
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS @table@_log_last_t ON @schema@.@table@_log (key, last_t, upto);

-- One key's working copy inside a call (PL/pgSQL arrays of it).
DO $$
BEGIN
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

-- base.debt_charge: what a charge without a check of cost takes from a limit with left
-- remaining (below 0 in debt): all of it, never past -deepest (the count, or the burst).
CREATE OR REPLACE FUNCTION @schema@.rk_debt_charge(cost numeric, left_ numeric, deepest numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN cost <= deepest + left_ THEN cost WHEN deepest + left_ > 0 THEN deepest + left_ ELSE 0 END $$;

-- bucket.deepest_debt: the deepest debt of a bucket (n, cap, full): one capacity, never so
-- deep that full + debt * n reaches 2^53.
CREATE OR REPLACE FUNCTION @schema@.rk_deepest_debt(n numeric, cap numeric, full_ numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT least(cap, div(9007199254740991 - full_, n)) $$;

-- base.later: whether retry time a is later than b (-1 = never, the latest).
CREATE OR REPLACE FUNCTION @schema@.rk_later(a numeric, b numeric) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN a = -1 THEN b <> -1 ELSE b <> -1 AND a > b END $$;
