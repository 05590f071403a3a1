-- ratekeeper: the one function a store call runs, and the bounded sweep of idle rows.
--
-- @schema@.@table@_decide(keys text[], request text) RETURNS bigint[]
--   keys     the storage keys of the call (ratekeeper.stores.wire.storage_key), 1-based
--   request  the request's fields in the wire format (ratekeeper/stores/wire.py), joined
--            by commas (one text parameter is much cheaper for the client to send than an
--            array; a lease id has its '%' and ',' percent-encoded, the other fields are
--            numbers and names):
--           now ("" = this server's clock_timestamp(), else µs), atomic ("1" / "0"),
--           n_ops, then per op: mode ("d" decide, "p" peek, "r" refund, "c" charge
--           without a check), key index,
--           algorithm, n_limits, n_limits x spec fields, cost, max_wait ("" = none),
--           lease ("" = none)
--   returns the flat reply: per "d" / "p" / "c" op allowed, denied_index, retry_us, delay_us,
--           remaining_1..n, reset_1..n; per "r" op 1, but 0 for a release of a lease this
--           key did not hold (expired, released, another key's or rule's)
--
-- How it stays exact and never deadlocks: every row the call touches is locked first, in
-- one global order (the keys sorted bytewise), inside this one statement; a missing row is
-- created as a placeholder (INSERT ... ON CONFLICT DO NOTHING) so that concurrent calls on
-- a new key queue on it too. The clock is read after the locks are held. The ops are then
-- decided in order on working copies (ops on the same key see each other's effects) and
-- the changed rows written back; an atomic call whose "d" ops are not all admitted writes
-- nothing. No lock outlives the statement. One call in SWEEP_EVERY also runs the sweep.
--
-- A sliding log's sealed segments (@table@_log, sliding_window_log.sql) are written with its
-- state row: inserted and deleted by @table@_log_flush when the state is written back, and
-- deleted with the row (a refund that leaves it whole, the sweep, a reset).
--
-- @schema@.@table@_sweep(max_rows int) RETURNS int
--   deletes at most max_rows rows whose expires_at has passed (and their segments),
--   skipping rows that another call holds, when it gets the sweep's advisory lock
--   (pg_try_advisory_xact_lock, never waiting); returns the number of rows deleted (0 when
--   another instance is sweeping).
--
-- @schema@.@table@_reset(key text) RETURNS void
--   deletes one key's row (waiting for a call that holds it) and its segments.

CREATE OR REPLACE FUNCTION @schema@.@table@_sweep(max_rows int) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    wall bigint := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    gone text[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('ratekeeper.sweep'), hashtext('@schema@.@table@')) THEN
        RETURN 0;
    END IF;
    WITH d AS (
        DELETE FROM @schema@.@table@ WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM @schema@.@table@ WHERE expires_at < wall
            ORDER BY expires_at LIMIT max_rows FOR UPDATE SKIP LOCKED))
        RETURNING key)
    SELECT coalesce(array_agg(key), '{}') INTO gone FROM d;
    IF cardinality(gone) > 0 THEN
        -- A statement of its own: it sees every segment written by the rows' last holders.
        DELETE FROM @schema@.@table@_log WHERE key = ANY (gone);
    END IF;
    RETURN cardinality(gone);
END
$$;

CREATE OR REPLACE FUNCTION @schema@.@table@_reset(k text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    DELETE FROM @schema@.@table@ WHERE key = k;
    DELETE FROM @schema@.@table@_log WHERE key = k;  -- after the row's holder is done
END
$$;

CREATE OR REPLACE FUNCTION @schema@.@table@_decide(keys text[], request text) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    args text[] := string_to_array(request, ',');
    SWEEP_EVERY CONSTANT float8 := 1.0 / 64;  -- the share of calls that also sweep
    SWEEP_ROWS CONSTANT int := 100;           -- at most this many rows per sweep
    GRACE_US CONSTANT bigint := 1000000;      -- rows live this long past their whole time
    TEST_GRACE_US CONSTANT bigint := 86400000000;  -- ... a day when the call gave its own now
    EXPIRY_STEP_US CONSTANT bigint := 10000000;   -- expires_at moves forward in steps of at least this
    given text := args[1];
    atomic boolean := args[2] = '1';
    n_ops int := args[3]::int;
    n_keys int := coalesce(array_length(keys, 1), 0);
    slots @schema@.rk_slot[];
    s @schema@.rk_slot;
    k int;
    pos int;
    mode text;
    algo text;
    n_limits int;
    width int;
    spec bigint[];
    cost bigint;
    mw bigint;
    lease text;
    chk record;
    res record;
    life bigint;
    wall bigint;
    now_us bigint;
    out bigint[] := '{}';
    refused boolean := false;
    peek_only boolean := true;
    expires bigint;
    order_ int[];
    reply bigint[];
    new_state numeric[];
    new_leases text[];
    logs boolean[] := '{}';  -- per key: a sliding log (its segments are written with it)
BEGIN
    -- Which keys the call writes: a call of peeks only reads, and locks nothing.
    pos := 4;
    FOR o IN 1..n_ops LOOP
        IF args[pos] <> 'p' THEN
            peek_only := false;
        END IF;
        algo := args[pos + 2];
        width := CASE WHEN algo IN ('gcra', 'token_bucket', 'leaky_bucket') THEN 4 ELSE 2 END;
        pos := pos + 7 + args[pos + 3]::int * width;
    END LOOP;
    IF pos <> coalesce(array_length(args, 1), 0) + 1 THEN
        RAISE EXCEPTION 'ratekeeper: malformed call: % args, expected %', array_length(args, 1), pos - 1;
    END IF;

    -- Lock (or create) every row in one order.
    slots := array_fill(NULL::@schema@.rk_slot, ARRAY[n_keys]);
    IF n_keys = 1 THEN
        order_ := ARRAY[1];
    ELSE
        order_ := ARRAY(SELECT i FROM generate_subscripts(keys, 1) AS i ORDER BY keys[i] COLLATE "C");
    END IF;
    FOREACH k IN ARRAY order_ LOOP
        s := ROW(NULL, NULL, false, false, 0, NULL, 0);
        IF peek_only THEN
            SELECT t.state, t.leases INTO s.state, s.leases FROM @schema@.@table@ t WHERE t.key = keys[k];
        ELSE
            LOOP
                SELECT t.ctid, t.state, t.leases, t.expires_at INTO s.row_id, s.state, s.leases, s.expires
                FROM @schema@.@table@ t WHERE t.key = keys[k] FOR UPDATE;
                EXIT WHEN FOUND;
                INSERT INTO @schema@.@table@ AS t (key, state, leases, expires_at) VALUES (keys[k], NULL, NULL, 0)
                ON CONFLICT (key) DO NOTHING RETURNING t.ctid INTO s.row_id;
                IF FOUND THEN
                    s.fresh := true;
                    EXIT;
                END IF;
            END LOOP;
        END IF;
        slots[k] := s;
    END LOOP;

    wall := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    now_us := CASE WHEN given = '' THEN wall ELSE given::bigint END;

    -- Decide every op in order.
    pos := 4;
    FOR o IN 1..n_ops LOOP
        mode := args[pos];
        k := args[pos + 1]::int;
        algo := args[pos + 2];
        n_limits := args[pos + 3]::int;
        width := CASE WHEN algo IN ('gcra', 'token_bucket', 'leaky_bucket') THEN 4 ELSE 2 END;
        spec := args[pos + 4 : pos + 3 + n_limits * width]::bigint[];
        pos := pos + 4 + n_limits * width;
        cost := args[pos]::bigint;
        mw := nullif(args[pos + 1], '')::bigint;
        lease := nullif(args[pos + 2], '');
        pos := pos + 3;
        s := slots[k];
        IF mode = 'c' THEN
            -- A charge without a check (Algorithm.charge): no lease, nothing refused.
            new_leases := s.leases;
            CASE algo
                WHEN 'gcra', 'leaky_bucket' THEN
                    SELECT * INTO new_state, reply FROM @schema@.rk_gcra_charge(s.state, now_us, spec, cost);
                WHEN 'token_bucket' THEN
                    SELECT * INTO new_state, reply FROM @schema@.rk_token_bucket_charge(s.state, now_us, spec, cost);
                WHEN 'fixed_window' THEN
                    SELECT * INTO new_state, reply FROM @schema@.rk_fixed_window_charge(s.state, now_us, spec, cost);
                WHEN 'sliding_window_counter' THEN
                    SELECT * INTO new_state, reply
                    FROM @schema@.rk_sliding_window_counter_charge(s.state, now_us, spec, cost);
                WHEN 'sliding_window_log' THEN
                    res := @schema@.@table@_sliding_window_log(keys[k], s.state, s.leases, now_us, spec, cost, mode);
                    new_state := res.new_state;
                    reply := res.reply;
                    logs[k] := true;
                ELSE
                    RAISE EXCEPTION 'ratekeeper: % cannot charge without a check', algo;
            END CASE;
        ELSE
            CASE algo
                WHEN 'gcra' THEN
                    res := @schema@.rk_gcra(s.state, s.leases, now_us, spec, cost, mw, lease, mode = 'r');
                WHEN 'fixed_window' THEN
                    res := @schema@.rk_fixed_window(s.state, s.leases, now_us, spec, cost, mw, lease, mode = 'r');
                WHEN 'token_bucket' THEN
                    res := @schema@.rk_token_bucket(s.state, s.leases, now_us, spec, cost, mw, lease, mode = 'r');
                WHEN 'leaky_bucket' THEN
                    res := @schema@.rk_leaky_bucket(s.state, s.leases, now_us, spec, cost, mw, lease, mode = 'r');
                WHEN 'sliding_window_log' THEN
                    res := @schema@.@table@_sliding_window_log(keys[k], s.state, s.leases, now_us, spec, cost, mode);
                    logs[k] := true;
                WHEN 'sliding_window_counter' THEN
                    res := @schema@.rk_sliding_window_counter(
                        s.state, s.leases, now_us, spec, cost, mw, lease, mode = 'r');
                WHEN 'concurrency' THEN
                    res := @schema@.rk_concurrency(s.state, s.leases, now_us, spec, cost, mw, lease, mode = 'r');
                ELSE
                    RAISE EXCEPTION 'ratekeeper: unknown algorithm %', algo;
            END CASE;
            new_state := res.new_state;
            new_leases := res.new_leases;
            reply := res.reply;
        END IF;
        IF mode = 'r' THEN
            -- the algorithm says whether a lease was held; a cost refund says 1
            out := out || coalesce(reply, ARRAY[1]::bigint[]);
            -- As MemoryStore.refund: a state that is whole again is deleted.
            IF algo = 'sliding_window_log' THEN
                chk := @schema@.@table@_sliding_window_log(keys[k], new_state, new_leases, now_us, spec, 0, 'p');
            ELSE
                chk := @schema@.rk_apply(algo, new_state, new_leases, now_us, spec, 0, NULL, NULL, false);
            END IF;
            life := 0;
            FOR j IN 5 + n_limits .. 4 + 2 * n_limits LOOP
                life := greatest(life, chk.reply[j]);
            END LOOP;
            IF life <= 0 THEN
                s.state := NULL;
                s.leases := NULL;
            ELSE
                s.state := new_state;
                s.leases := new_leases;
            END IF;
            s.dirty := true;
            s.life := life;
        ELSE
            out := out || reply;
            IF mode = 'd' OR mode = 'c' THEN  -- a charge is never refused: reply[1] is 1
                IF reply[1] = 0 THEN
                    refused := true;
                END IF;
                IF new_state IS DISTINCT FROM s.state OR new_leases IS DISTINCT FROM s.leases THEN
                    s.state := new_state;
                    s.leases := new_leases;
                    s.dirty := true;
                    life := 0;
                    FOR j IN 5 + n_limits .. 4 + 2 * n_limits LOOP
                        life := greatest(life, reply[j]);
                    END LOOP;
                    s.life := life;
                END IF;
            END IF;
        END IF;
        slots[k] := s;
    END LOOP;

    -- Write back (nothing when an atomic call was refused); drop unused placeholders.
    IF NOT peek_only THEN
        FOR k IN 1..n_keys LOOP
            s := slots[k];
            IF s.dirty AND NOT (atomic AND refused) AND s.state IS NOT NULL THEN
                expires := CASE WHEN given = '' THEN now_us + greatest(s.life, 0) + GRACE_US
                                ELSE wall + greatest(s.life, 0) + TEST_GRACE_US END;
                -- Never earlier than needed; when it must move, a step further than needed, so
                -- a busy key's updates rarely change an indexed column (HOT updates).
                IF expires <= s.expires THEN
                    expires := s.expires;
                ELSE
                    expires := (expires / 1000000 + 1) * 1000000 + EXPIRY_STEP_US;
                END IF;
                IF logs[k] AND s.state[5] <> 0 THEN  -- the log's segments have work (its flags)
                    s.state := @schema@.@table@_log_flush(keys[k], s.state);
                END IF;
                UPDATE @schema@.@table@ SET state = s.state, leases = s.leases, expires_at = expires
                WHERE ctid = s.row_id;
            ELSIF s.fresh OR (s.dirty AND NOT (atomic AND refused)) THEN
                DELETE FROM @schema@.@table@ WHERE ctid = s.row_id;
                IF logs[k] AND NOT s.fresh THEN
                    DELETE FROM @schema@.@table@_log WHERE key = keys[k];
                END IF;
            END IF;
        END LOOP;
        IF random() < SWEEP_EVERY THEN
            PERFORM @schema@.@table@_sweep(SWEEP_ROWS);
        END IF;
    END IF;
    RETURN out;
END
$$;

-- The algorithm functions by name (one file each, the sliding log aside: it reads its
-- table's segments); raises for an unknown name.
CREATE OR REPLACE FUNCTION @schema@.rk_apply(
    algo text, st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    CASE algo
        WHEN 'gcra' THEN
            SELECT * INTO new_state, new_leases, reply FROM @schema@.rk_gcra(st, ls, now_us, spec, cost, max_wait, lease, refund);
        WHEN 'fixed_window' THEN
            SELECT * INTO new_state, new_leases, reply FROM @schema@.rk_fixed_window(st, ls, now_us, spec, cost, max_wait, lease, refund);
        WHEN 'token_bucket' THEN
            SELECT * INTO new_state, new_leases, reply FROM @schema@.rk_token_bucket(st, ls, now_us, spec, cost, max_wait, lease, refund);
        WHEN 'leaky_bucket' THEN
            SELECT * INTO new_state, new_leases, reply FROM @schema@.rk_leaky_bucket(st, ls, now_us, spec, cost, max_wait, lease, refund);
        WHEN 'sliding_window_counter' THEN
            SELECT * INTO new_state, new_leases, reply FROM @schema@.rk_sliding_window_counter(st, ls, now_us, spec, cost, max_wait, lease, refund);
        WHEN 'concurrency' THEN
            SELECT * INTO new_state, new_leases, reply FROM @schema@.rk_concurrency(st, ls, now_us, spec, cost, max_wait, lease, refund);
        ELSE
            RAISE EXCEPTION 'ratekeeper: unknown algorithm %', algo;
    END CASE;
END
$$;
