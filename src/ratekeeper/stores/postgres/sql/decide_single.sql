-- ratekeeper: the lean path of the commonest call, one decide or peek on one key.
--
-- @schema@.@table@_decide_single(k text, request text) RETURNS bigint[]
--   k        the op's storage key (ratekeeper.stores.wire.storage_key)
--   request  the same fields as @table@_decide's request for a call of one op (the wire
--            format, joined by commas): now ("" = clock_timestamp(), else µs), atomic
--            ("1" / "0"), n_ops (1), mode ("d" or "p"; a refund takes @table@_decide), key
--            index (1), algorithm, n_limits, n_limits x spec fields, cost, max_wait ("" =
--            none), lease ("" = none)
--   returns @table@_decide's reply for that call: allowed, denied_index, retry_us,
--            delay_us, remaining_1..n, reset_1..n
--
-- The same decision and the same stored row (state, leases, expires_at, a sliding log's
-- segments) as @table@_decide, with less of its general machinery: no loop over ops, no
-- composite working copies, no placeholder row. A "d" op locks its row (SELECT ... FOR
-- UPDATE), reads the clock after the lock is held and calls the algorithm's function
-- directly; the state is written back by ctid when it changed (never for a refused atomic
-- call), deleted when it is whole (NULL). A missing row is not created before deciding:
-- the INSERT of the new state does it (ON CONFLICT DO NOTHING), and a call that lost the
-- race to create it decides again on the winner's row, with the clock read again. A "p"
-- op locks and writes nothing. The row's expires_at follows @table@_decide's rules, and
-- one "d" call in 64 also sweeps, as there.
CREATE OR REPLACE FUNCTION @schema@.@table@_decide_single(k text, request text) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    a text[] := string_to_array(request, ',');
    given bigint := nullif(a[1], '');
    commit_ boolean := a[4] = 'd';
    algo text := a[6];
    n_limits int := a[7];
    at int := 8 + n_limits * CASE WHEN algo IN ('gcra', 'token_bucket', 'leaky_bucket') THEN 4 ELSE 2 END;  -- cost
    spec bigint[];
    cost bigint;
    mw bigint;
    lease text;
    st numeric[];
    ls text[];
    rid tid;
    old_expires bigint;
    wall bigint;
    now_us bigint;
    res record;
    life bigint := 0;
    expires bigint;
BEGIN
    IF array_length(a, 1) <> at + 2 OR a[3] <> '1' OR NOT (commit_ OR a[4] = 'p') THEN
        RAISE EXCEPTION 'ratekeeper: malformed decide_single call: %', request;
    END IF;
    spec := a[8 : at - 1]::bigint[];
    cost := a[at];
    mw := nullif(a[at + 1], '');
    lease := nullif(a[at + 2], '');
    LOOP
        IF commit_ THEN
            SELECT t.ctid, t.state, t.leases, t.expires_at INTO rid, st, ls, old_expires
            FROM @schema@.@table@ t WHERE t.key = k FOR UPDATE;
        ELSE
            SELECT t.state, t.leases INTO st, ls FROM @schema@.@table@ t WHERE t.key = k;
        END IF;
        wall := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
        now_us := coalesce(given, wall);
        CASE algo
            WHEN 'gcra' THEN
                res := @schema@.rk_gcra(st, ls, now_us, spec, cost, mw, lease, false);
            WHEN 'fixed_window' THEN
                res := @schema@.rk_fixed_window(st, ls, now_us, spec, cost, mw, lease, false);
            WHEN 'token_bucket' THEN
                res := @schema@.rk_token_bucket(st, ls, now_us, spec, cost, mw, lease, false);
            WHEN 'leaky_bucket' THEN
                res := @schema@.rk_leaky_bucket(st, ls, now_us, spec, cost, mw, lease, false);
            WHEN 'sliding_window_log' THEN
                res := @schema@.@table@_sliding_window_log(k, st, ls, now_us, spec, cost, 'd');
            WHEN 'sliding_window_counter' THEN
                res := @schema@.rk_sliding_window_counter(st, ls, now_us, spec, cost, mw, lease, false);
            WHEN 'concurrency' THEN
                res := @schema@.rk_concurrency(st, ls, now_us, spec, cost, mw, lease, false);
            ELSE
                RAISE EXCEPTION 'ratekeeper: unknown algorithm %', algo;
        END CASE;
        IF NOT commit_ THEN
            RETURN res.reply;  -- a peek
        END IF;
        -- Nothing to write: an unchanged state, a refused atomic call.
        EXIT WHEN (res.new_state IS NOT DISTINCT FROM st AND res.new_leases IS NOT DISTINCT FROM ls)
                  OR (res.reply[1] = 0 AND a[2] = '1');
        IF res.new_state IS NULL THEN  -- whole again: no row
            IF rid IS NOT NULL THEN
                DELETE FROM @schema@.@table@ WHERE ctid = rid;
                IF algo = 'sliding_window_log' THEN
                    DELETE FROM @schema@.@table@_log WHERE key = k;
                END IF;
            END IF;
            EXIT;
        END IF;
        FOR j IN 5 + n_limits .. 4 + 2 * n_limits LOOP
            life := greatest(life, res.reply[j]);
        END LOOP;
        -- As @table@_decide: the row lives a second past its whole time (a day by the wall
        -- clock when the call gave its now); never earlier than stored, and when it must
        -- move, a step of 10 s further (a busy key's updates stay HOT).
        expires := CASE WHEN given IS NULL THEN now_us + life + 1000000 ELSE wall + life + 86400000000 END;
        expires := CASE WHEN expires <= coalesce(old_expires, 0) THEN coalesce(old_expires, 0)
                        ELSE (expires / 1000000 + 1) * 1000000 + 10000000 END;
        st := res.new_state;
        IF algo = 'sliding_window_log' AND st[5] <> 0 THEN  -- the log's segments have work (its flags)
            st := @schema@.@table@_log_flush(k, st);  -- (never for a new row's one entry)
        END IF;
        IF rid IS NULL THEN
            INSERT INTO @schema@.@table@ (key, state, leases, expires_at) VALUES (k, st, res.new_leases, expires)
            ON CONFLICT (key) DO NOTHING;
            EXIT WHEN FOUND;
            life := 0;
            CONTINUE;  -- another call created the row first: decide on it
        END IF;
        UPDATE @schema@.@table@ SET state = st, leases = res.new_leases, expires_at = expires WHERE ctid = rid;
        EXIT;
    END LOOP;
    IF random() < 1.0 / 64 THEN
        PERFORM @schema@.@table@_sweep(100);
    END IF;
    RETURN res.reply;
END
$$;
