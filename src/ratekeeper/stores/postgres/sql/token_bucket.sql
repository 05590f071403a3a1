-- ratekeeper: token bucket (ratekeeper/algorithms/token_bucket.py), as one PL/pgSQL function.
--
-- Parameters (the same for every algorithm function, called by @table@_decide):
--   st        the stored state: (level_1, last_1, level_2, last_2, ...), the level in
--             units (a token is n units, the bucket gains d units per µs) after the last
--             refill at last (µs); NULL when absent (full)
--   ls        lease ids (unused here)
--   now_us    now in µs
--   spec      per limit (n, d, capacity, full) with n/d µs per token, full = capacity * n
--   cost      the cost (>= 0)
--   max_wait  NULL (try_acquire) or µs: a reservation may take tokens that arrive within it
--   lease     the lease id (unused here)
--   refund    false: decide; true: give back cost (reply is NULL)
-- Returns new_state / new_leases (the state to keep) and reply (the wire format's fields:
-- allowed, denied_index, retry_us, delay_us, remaining_1..n, reset_1..n).
-- Same arithmetic as TokenBucket.decide / TokenBucket.refund, step for step (exact integers).

-- TokenBucket._level: the level of limit i at now_us.
CREATE OR REPLACE FUNCTION @schema@.rk_token_level(st numeric[], i int, now_us bigint, d bigint, full_ bigint)
RETURNS numeric LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    level numeric;
    elapsed numeric;
BEGIN
    IF st IS NULL THEN
        RETURN full_;
    END IF;
    level := st[2 * i - 1];
    elapsed := now_us - st[2 * i];
    IF elapsed <= 0 THEN
        RETURN level;
    END IF;
    IF elapsed >= @schema@.rk_cdiv(full_ - level, d) THEN
        RETURN full_;
    END IF;
    RETURN level + elapsed * d;
END
$$;

CREATE OR REPLACE FUNCTION @schema@.rk_token_bucket(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    cnt int := array_length(spec, 1) / 4;
    n bigint;
    d bigint;
    cap bigint;
    full_ bigint;
    level numeric;
    levels numeric[] := '{}';
    need numeric;
    w numeric;
    wait numeric := 0;
    denied int := -1;
    infinite boolean := false;
    allowed boolean;
    remaining bigint[] := '{}';
    resets bigint[] := '{}';
BEGIN
    new_leases := ls;
    IF refund THEN
        IF st IS NULL THEN
            new_state := NULL;
            RETURN;
        END IF;
        new_state := '{}';
        FOR i IN 1..cnt LOOP
            n := spec[4 * i - 3];
            d := spec[4 * i - 2];
            full_ := spec[4 * i];
            new_state := new_state
                || least(full_::numeric, @schema@.rk_token_level(st, i, now_us, d, full_) + cost::numeric * n)
                || greatest(now_us::numeric, st[2 * i]);
        END LOOP;
        RETURN;
    END IF;
    FOR i IN 1..cnt LOOP
        n := spec[4 * i - 3];
        d := spec[4 * i - 2];
        cap := spec[4 * i - 1];
        full_ := spec[4 * i];
        level := @schema@.rk_token_level(st, i, now_us, d, full_);
        levels[i] := level;
        IF cost > cap THEN
            IF NOT infinite THEN
                infinite := true;
                denied := i - 1;
            END IF;
            CONTINUE;
        END IF;
        need := cost::numeric * n;
        IF level < need THEN
            w := @schema@.rk_cdiv(need - level, d);
            IF w > wait THEN
                wait := w;
                IF NOT infinite THEN
                    denied := i - 1;
                END IF;
            END IF;
        END IF;
    END LOOP;
    allowed := NOT infinite AND wait <= coalesce(max_wait, 0);
    IF allowed THEN
        denied := -1;
        IF cost <> 0 THEN
            FOR i IN 1..cnt LOOP
                levels[i] := levels[i] - cost::numeric * spec[4 * i - 3];
            END LOOP;
        END IF;
    END IF;
    FOR i IN 1..cnt LOOP
        remaining[i] := greatest(0, @schema@.rk_fdiv(levels[i], spec[4 * i - 3]));
        resets[i] := CASE WHEN levels[i] < spec[4 * i] THEN @schema@.rk_cdiv(spec[4 * i] - levels[i], spec[4 * i - 2])
                          ELSE 0 END;
    END LOOP;
    IF allowed THEN
        reply := ARRAY[1, -1, 0, wait]::bigint[] || remaining || resets;
        IF cost = 0 THEN
            new_state := st;
        ELSE
            new_state := '{}';
            FOR i IN 1..cnt LOOP
                -- A clock that stepped back never moves the refill point back (no double refill).
                new_state := new_state || levels[i]
                    || CASE WHEN st IS NULL OR now_us > st[2 * i] THEN now_us::numeric ELSE st[2 * i] END;
            END LOOP;
        END IF;
    ELSE
        reply := ARRAY[0, denied, CASE WHEN infinite THEN -1 ELSE wait END, 0]::bigint[] || remaining || resets;
        new_state := st;
    END IF;
END
$$;
