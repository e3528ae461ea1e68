-- The reservations of one event-loop turn in one statement and one transaction (issue 43 item 1,
-- src/store/reserve-keys.ts): one round trip, one commit and one flush for all of a turn's new
-- keys, where each paid its own. Lease-bound commands stay on fg_reserve, one by one.
--
-- Each command is decided exactly as fg_reserve decides it alone, in two steps: its fence (or
-- the read that answers a replay without writing), then its key. fg_reserve's two steps are
-- moved here into functions of their own, fg_key_replay and fg_take_key, so that the key's
-- upsert has one home; fg_reserve calls them in the same order as before and decides the same.
--
-- Why no two batches can deadlock. Every transaction that locks rows of fg_fences or of
-- fg_idempotency takes them in one global order: fence rows first, in (tenant, entity) order,
-- then key rows, in (tenant, key) order, both compared as the gateway's JavaScript compares
-- strings (the caller ranks the commands: `fo` and `ko` below):
-- - a batch of keys presents ALL its fences first (step 1, in `fo` order, arrival order within
--   an entity), then takes ALL its keys (step 2, in `ko` order, arrival order within a key);
-- - a batch of fences (0018) takes fence rows only, in the same (tenant, entity) order;
-- - a batch of completions (fg_complete, src/store/completions.ts) takes key rows only, in
--   (tenant, key) order;
-- - fg_reserve alone takes at most one fence row, then one key row; a bump or a slot one fence
--   row; a release, a mark or an operator's release one key row.
-- A transaction that waits holds only rows before the one it waits for, so a cycle of waits
-- would need a row before itself: none can form. Deciding command by command in arrival order
-- (fence, key, fence, key…) could not be ordered so: the same key under two entities, or
-- opposite pairings of keys and entities, lock in opposite orders in two batches.
-- Left outside the order: purgeExpired deletes expired keys in expiry order, and a batch may
-- take over an expired key. PostgreSQL breaks such a rare cycle after deadlock_timeout, and
-- the batcher presents the rolled-back batch again one command at a time (src/store/batch.ts).
--
-- Why two steps decide as arrival order would. A fence's decision depends only on the commands
-- of its entity before it, and they come before it in step 1. A key's decision depends only on
-- the commands of that key before it that reached their key (a stale fence touches no key), and
-- step 1 has decided which did. A replay's read in step 1 sees the same record as in arrival
-- order: no reservation turns a live completed record into anything else. So a second command
-- of a key in a batch sees the first's reservation (in_progress), as it would one turn later.
--
-- A PL/pgSQL function that returns its rows only at its end (see 0018: postgres.js 3.4.9 and
-- an error after rows were sent). `lsn`: the WAL insert position after the command's last
-- step, NULL while the transaction had written nothing, as fg_reserve's statement reads it.

-- A completed answer of the same payload while the fence stays where it is (it equals the
-- entity's highest, or there is none): a replay, answered by a read.
CREATE FUNCTION fg_key_replay(p_tenant text, p_entity text, p_fence bigint, p_key text, p_fingerprint text)
RETURNS TABLE (status integer, headers text, body bytea)
LANGUAGE sql STABLE AS $$
  SELECT k.status, k.headers::text, k.body
  FROM fg_idempotency AS k
  WHERE k.tenant = p_tenant AND k.key = p_key AND k.state = 'completed' AND k.fingerprint = p_fingerprint
    AND k.expires_at > now()
    AND (p_fence IS NULL OR EXISTS (
      SELECT 1 FROM fg_fences AS f WHERE f.tenant = p_tenant AND f.entity = p_entity AND f.highest_fence = p_fence))
$$;

-- 0019's key step of fg_reserve, unchanged: the key is inserted, or its record locked and
-- returned (taken over only when it expired, or when it is an unknown outcome of this payload
-- on a route that retries those); a key reused with another payload is audited.
CREATE FUNCTION fg_take_key(
  p_tenant text, p_route text, p_entity text, p_fence bigint, p_method text, p_path text,
  p_body_sha256 text, p_caller text, p_request_id text, p_key text, p_fingerprint text,
  p_owner_token text, p_lock_ms bigint, p_ttl_ms bigint, p_retry_unknown boolean, p_trace_id text,
  OUT k_state text, OUT k_owned boolean, OUT k_same boolean, OUT k_status integer, OUT k_headers text,
  OUT k_body bytea, OUT k_retry_ms integer, OUT k_age_ms integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  INSERT INTO fg_idempotency AS k (tenant, key, fingerprint, route, state, entity, fence, locked_until, expires_at, owner_token, request_id)
  VALUES (p_tenant, p_key, p_fingerprint, p_route, 'in_flight', p_entity, p_fence,
          now() + p_lock_ms * interval '1 millisecond',
          now() + (p_lock_ms + p_ttl_ms) * interval '1 millisecond',
          p_owner_token, p_request_id)
  ON CONFLICT (tenant, key) DO UPDATE SET
    (state, owner_token, fingerprint, route, entity, fence, locked_until, expires_at,
     request_id, attempt, created_at, completed_at, status, headers, body) = (
      SELECT state, owner_token, fingerprint, route, entity, fence, locked_until, expires_at,
             request_id, attempt, created_at, completed_at, status, headers, body
      FROM (
        SELECT 0 AS pick, 'in_flight' AS state, EXCLUDED.owner_token AS owner_token, EXCLUDED.fingerprint AS fingerprint,
               EXCLUDED.route AS route, EXCLUDED.entity AS entity, EXCLUDED.fence AS fence,
               EXCLUDED.locked_until AS locked_until, EXCLUDED.expires_at AS expires_at, EXCLUDED.request_id AS request_id,
               CASE WHEN k.expires_at <= now() THEN 1 ELSE k.attempt + 1 END AS attempt, now() AS created_at,
               NULL::timestamptz AS completed_at, NULL::integer AS status, NULL::jsonb AS headers, NULL::bytea AS body
        WHERE k.expires_at <= now()
           OR (p_retry_unknown AND k.fingerprint = EXCLUDED.fingerprint
               AND (k.state = 'outcome_unknown' OR (k.state = 'in_flight' AND k.locked_until <= now())))
        UNION ALL
        SELECT 1, CASE WHEN k.state = 'in_flight' AND k.locked_until <= now() THEN 'outcome_unknown' ELSE k.state END,
               k.owner_token, k.fingerprint, k.route, k.entity, k.fence,
               CASE WHEN k.state = 'in_flight' AND k.locked_until <= now() THEN NULL ELSE k.locked_until END,
               k.expires_at, k.request_id, k.attempt, k.created_at, k.completed_at, k.status, k.headers, k.body
      ) AS choice
      ORDER BY pick LIMIT 1)
  RETURNING k.state, k.owner_token = p_owner_token, k.fingerprint = p_fingerprint,
            k.status, k.headers::text, k.body,
            GREATEST(0, ceil(extract(epoch FROM (k.locked_until - now())) * 1000))::integer,
            GREATEST(0, floor(extract(epoch FROM (now() - k.created_at)) * 1000))::integer
  INTO k_state, k_owned, k_same, k_status, k_headers, k_body, k_retry_ms, k_age_ms;
  IF NOT k_owned AND NOT k_same THEN
    INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, body_sha256, caller, request_id, idempotency_key, trace_id)
    VALUES (p_tenant, p_route, p_entity, 'idempotency_key_reused', p_fence, NULL, p_method, p_path, p_body_sha256, p_caller, p_request_id, p_key, p_trace_id);
  END IF;
END $$;

-- 0019's, its two steps now the functions above; the signature and the decisions are the same.
CREATE OR REPLACE FUNCTION fg_reserve(
  p_tenant text, p_route text, p_entity text, p_fence bigint, p_method text, p_path text,
  p_body_sha256 text, p_caller text, p_request_id text, p_key text, p_fingerprint text,
  p_owner_token text, p_lock_ms bigint, p_ttl_ms bigint, p_retry_unknown boolean, p_lease_job bigint,
  p_trace_id text DEFAULT NULL)
RETURNS TABLE (lease_ok boolean, highest text, state text, owned boolean, same_payload boolean,
               status integer, headers text, body bytea, retry_after_ms integer, age_ms integer)
LANGUAGE plpgsql AS $$
DECLARE
  v_highest bigint;
BEGIN
  IF p_lease_job IS NULL AND p_key IS NOT NULL THEN
    RETURN QUERY SELECT true, p_fence::text, 'completed'::text, false, true, r.status, r.headers, r.body, 0, 0
      FROM fg_key_replay(p_tenant, p_entity, p_fence, p_key, p_fingerprint) AS r;
    IF FOUND THEN
      RETURN;
    END IF;
  END IF;
  -- A lease-bound command whose fence is not its job's current token on a live lease held
  -- under the command's own subject (p_caller, the token's sub; NULL without auth).
  IF p_lease_job IS NOT NULL AND NOT fg_lease_live(p_tenant, p_lease_job, p_fence, p_caller) THEN
    INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, method, path, body_sha256, caller, request_id, idempotency_key, trace_id)
    VALUES (p_tenant, p_route, p_entity, 'lease_expired', p_fence, p_method, p_path, p_body_sha256, p_caller, p_request_id, p_key, p_trace_id);
    RETURN QUERY SELECT false, NULL::text, NULL::text, NULL::boolean, NULL::boolean, NULL::integer, NULL::text, NULL::bytea, NULL::integer, NULL::integer;
    RETURN;
  END IF;
  IF p_fence IS NOT NULL THEN
    v_highest := fg_present_fence(p_tenant, p_route, p_entity, p_fence, p_method, p_path, p_body_sha256, p_caller, p_request_id, p_key, p_trace_id);
  END IF;
  -- A stale fence (audited above) touches no key.
  IF p_key IS NULL OR v_highest > p_fence THEN
    RETURN QUERY SELECT true, v_highest::text, NULL::text, NULL::boolean, NULL::boolean, NULL::integer, NULL::text, NULL::bytea, NULL::integer, NULL::integer;
    RETURN;
  END IF;
  RETURN QUERY SELECT true, v_highest::text, t.k_state, t.k_owned, t.k_same, t.k_status, t.k_headers, t.k_body, t.k_retry_ms, t.k_age_ms
    FROM fg_take_key(p_tenant, p_route, p_entity, p_fence, p_method, p_path, p_body_sha256, p_caller, p_request_id,
      p_key, p_fingerprint, p_owner_token, p_lock_ms, p_ttl_ms, p_retry_unknown, p_trace_id) AS t;
END $$;

-- p_commands: [{i, fo, ko, tenant, route, entity, fence, method, path, body_sha256, caller,
-- request_id, key, fingerprint, owner_token, lock_ms, ttl_ms, retry_unknown, trace_id}], every
-- one with a key and without a lease; i from 0, fo and ko the ranks described above.
CREATE FUNCTION fg_reserve_keys(p_commands jsonb)
RETURNS TABLE (i int, highest text, state text, owned boolean, same_payload boolean,
               status integer, headers text, body bytea, retry_after_ms integer, age_ms integer, lsn text)
LANGUAGE plpgsql AS $$
DECLARE
  c record;
  n int := jsonb_array_length(p_commands);
  v bigint;
  r record;
  -- Each command's answer so far, at index i + 1; `take`: its fence let it on to its key.
  o_highest text[]; o_state text[]; o_owned boolean[]; o_same boolean[]; o_status integer[];
  o_headers text[]; o_body bytea[]; o_retry integer[]; o_age integer[]; o_lsn text[]; take boolean[];
BEGIN
  FOR c IN SELECT * FROM jsonb_to_recordset(p_commands) AS u(i int, fo int, tenant text, route text, entity text,
      fence bigint, method text, path text, body_sha256 text, caller text, request_id text, key text, fingerprint text,
      trace_id text) ORDER BY u.fo LOOP
    SELECT * INTO r FROM fg_key_replay(c.tenant, c.entity, c.fence, c.key, c.fingerprint);
    IF FOUND THEN
      o_highest[c.i + 1] := c.fence::text; o_state[c.i + 1] := 'completed'; o_owned[c.i + 1] := false;
      o_same[c.i + 1] := true; o_status[c.i + 1] := r.status; o_headers[c.i + 1] := r.headers; o_body[c.i + 1] := r.body;
      o_retry[c.i + 1] := 0; o_age[c.i + 1] := 0;
    ELSE
      IF c.fence IS NOT NULL THEN
        v := fg_present_fence(c.tenant, c.route, c.entity, c.fence, c.method, c.path, c.body_sha256, c.caller,
          c.request_id, c.key, c.trace_id);
        o_highest[c.i + 1] := v::text;
      END IF;
      take[c.i + 1] := c.fence IS NULL OR v <= c.fence;
    END IF;
    o_lsn[c.i + 1] := CASE WHEN pg_current_xact_id_if_assigned() IS NOT NULL THEN pg_current_wal_insert_lsn()::text END;
  END LOOP;
  FOR c IN SELECT * FROM jsonb_to_recordset(p_commands) AS u(i int, ko int, tenant text, route text, entity text,
      fence bigint, method text, path text, body_sha256 text, caller text, request_id text, key text, fingerprint text,
      owner_token text, lock_ms bigint, ttl_ms bigint, retry_unknown boolean, trace_id text) ORDER BY u.ko LOOP
    CONTINUE WHEN take[c.i + 1] IS NOT TRUE;
    SELECT * INTO r FROM fg_take_key(c.tenant, c.route, c.entity, c.fence, c.method, c.path, c.body_sha256, c.caller,
      c.request_id, c.key, c.fingerprint, c.owner_token, c.lock_ms, c.ttl_ms, c.retry_unknown, c.trace_id);
    o_state[c.i + 1] := r.k_state; o_owned[c.i + 1] := r.k_owned; o_same[c.i + 1] := r.k_same; o_status[c.i + 1] := r.k_status;
    o_headers[c.i + 1] := r.k_headers; o_body[c.i + 1] := r.k_body; o_retry[c.i + 1] := r.k_retry_ms; o_age[c.i + 1] := r.k_age_ms;
    o_lsn[c.i + 1] := pg_current_wal_insert_lsn()::text;
  END LOOP;
  FOR j IN 1 .. n LOOP
    i := j - 1; highest := o_highest[j]; state := o_state[j]; owned := o_owned[j]; same_payload := o_same[j];
    status := o_status[j]; headers := o_headers[j]; body := o_body[j]; retry_after_ms := o_retry[j]; age_ms := o_age[j];
    lsn := o_lsn[j];
    RETURN NEXT;
  END LOOP;
END $$;
