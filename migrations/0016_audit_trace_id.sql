-- Every audit row names the trace of the request that caused it (issue 31): an operator who
-- finds a rejection in /audit opens its trace, and one who finds a trace finds its rows
-- (`GET /audit?trace_id=`). NULL where the request had no trace (tracing off, the Workers
-- entry) and on every row written before this migration. The trace id is the W3C one, 32
-- lowercase hex digits, as the SERVER span's context and the log lines carry it.
ALTER TABLE fg_audit ADD COLUMN trace_id text;

-- The filter's index. Only traced rows are in it, so an untraced gateway writes nothing to it
-- (a partial index costs a row nothing when its predicate is false). By trace id alone, not
-- (tenant, trace_id): trace ids are random 128-bit values, so one names a handful of rows in
-- any tenant, and the admin's /audit reads every tenant when it names none, which a leading
-- tenant column would not serve.
CREATE INDEX fg_audit_by_trace ON fg_audit (trace_id) WHERE trace_id IS NOT NULL;

-- The functions that audit take the trace id as a trailing parameter. A parameter added with
-- CREATE OR REPLACE would be a second function beside the old one, and a call naming the old
-- arguments would then match both (ambiguous): each old signature is dropped first, as 0014
-- did. fg_reserve calls fg_present_fence by name at run time, so the order does not matter.
-- The bodies are 0015's and 0014's with only the column added.
DROP FUNCTION fg_present_fence(text, text, text, bigint, text, text, text, text, text, text);
CREATE FUNCTION fg_present_fence(
  p_tenant text, p_route text, p_entity text, p_fence bigint, p_method text, p_path text,
  p_body_sha256 text, p_caller text, p_request_id text, p_key text DEFAULT NULL, p_trace_id text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  v_highest bigint;
  v_previous bigint;
BEGIN
  SELECT highest_fence INTO v_highest FROM fg_fences WHERE tenant = p_tenant AND entity = p_entity;
  IF v_highest IS NULL THEN
    -- The entity's first fence, or one whose row another command is inserting: the upsert's
    -- arbiter decides which of them inserts, and GREATEST keeps the higher.
    INSERT INTO fg_fences AS f (tenant, entity, highest_fence, updated_at, request_id)
    VALUES (p_tenant, p_entity, p_fence, now(), p_request_id)
    ON CONFLICT (tenant, entity) DO UPDATE
      SET highest_fence = GREATEST(f.highest_fence, EXCLUDED.highest_fence),
          updated_at = CASE WHEN EXCLUDED.highest_fence >= f.highest_fence THEN now() ELSE f.updated_at END,
          request_id = CASE WHEN EXCLUDED.highest_fence >= f.highest_fence THEN EXCLUDED.request_id ELSE f.request_id END,
          previous_fence = f.highest_fence
    RETURNING highest_fence, previous_fence INTO v_highest, v_previous;
    IF v_previous IS NULL OR v_highest > v_previous THEN
      INSERT INTO fg_fence_history (tenant, entity, old_fence, new_fence, source, route, caller, request_id)
      VALUES (p_tenant, p_entity, v_previous, v_highest, 'command', p_route, p_caller, p_request_id);
    END IF;
  ELSIF v_highest < p_fence THEN
    -- A raise. The WHERE re-checks the fence on the latest committed row (READ COMMITTED
    -- re-reads a row another raise changed), so a concurrent higher raise updates nothing here.
    UPDATE fg_fences AS f
      SET highest_fence = p_fence, updated_at = now(), request_id = p_request_id, previous_fence = f.highest_fence
      WHERE f.tenant = p_tenant AND f.entity = p_entity AND f.highest_fence < p_fence
      RETURNING f.highest_fence, f.previous_fence INTO v_highest, v_previous;
    IF FOUND THEN
      INSERT INTO fg_fence_history (tenant, entity, old_fence, new_fence, source, route, caller, request_id)
      VALUES (p_tenant, p_entity, v_previous, v_highest, 'command', p_route, p_caller, p_request_id);
    ELSE
      -- Raised to at least p_fence meanwhile: its value now decides (equal accepted, higher stale).
      SELECT highest_fence INTO v_highest FROM fg_fences WHERE tenant = p_tenant AND entity = p_entity;
    END IF;
  END IF;
  IF v_highest > p_fence THEN
    INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, body_sha256, caller, request_id, idempotency_key, trace_id)
    VALUES (p_tenant, p_route, p_entity, 'stale_fence', p_fence, v_highest, p_method, p_path, p_body_sha256, p_caller, p_request_id, p_key, p_trace_id);
  END IF;
  RETURN v_highest;
END $$;

DROP FUNCTION fg_reserve(text, text, text, bigint, text, text, text, text, text, text, text, text, bigint, bigint, boolean, bigint);
CREATE FUNCTION fg_reserve(
  p_tenant text, p_route text, p_entity text, p_fence bigint, p_method text, p_path text,
  p_body_sha256 text, p_caller text, p_request_id text, p_key text, p_fingerprint text,
  p_owner_token text, p_lock_ms bigint, p_ttl_ms bigint, p_retry_unknown boolean, p_lease_job bigint,
  p_trace_id text DEFAULT NULL)
RETURNS TABLE (lease_ok boolean, highest text, state text, owned boolean, same_payload boolean,
               status integer, headers text, body bytea, retry_after_ms integer, age_ms integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_highest bigint;
  v_state text;
  v_owned boolean;
  v_same boolean;
  v_status integer;
  v_headers text;
  v_body bytea;
  v_retry_ms integer;
  v_age_ms integer;
BEGIN
  -- A completed answer of the same payload while the fence stays where it is (it equals the
  -- entity's highest, or there is none): nothing moves, so nothing is written.
  IF p_lease_job IS NULL AND p_key IS NOT NULL THEN
    RETURN QUERY
      SELECT true, p_fence::text, 'completed'::text, false, true, k.status, k.headers::text, k.body, 0, 0
      FROM fg_idempotency AS k
      WHERE k.tenant = p_tenant AND k.key = p_key AND k.state = 'completed' AND k.fingerprint = p_fingerprint
        AND k.expires_at > now()
        AND (p_fence IS NULL OR EXISTS (
          SELECT 1 FROM fg_fences AS f WHERE f.tenant = p_tenant AND f.entity = p_entity AND f.highest_fence = p_fence));
    IF FOUND THEN
      RETURN;
    END IF;
  END IF;
  -- A lease-bound command whose fence is not its job's current token on a live lease.
  IF p_lease_job IS NOT NULL AND NOT fg_lease_live(p_tenant, p_lease_job, p_fence) THEN
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
        -- Takeover: the record expired, or it is an unknown outcome of this very payload
        -- and the route retries those. The new request owns a fresh in-flight record.
        SELECT 0 AS pick, 'in_flight' AS state, EXCLUDED.owner_token AS owner_token, EXCLUDED.fingerprint AS fingerprint,
               EXCLUDED.route AS route, EXCLUDED.entity AS entity, EXCLUDED.fence AS fence,
               EXCLUDED.locked_until AS locked_until, EXCLUDED.expires_at AS expires_at, EXCLUDED.request_id AS request_id,
               CASE WHEN k.expires_at <= now() THEN 1 ELSE k.attempt + 1 END AS attempt, now() AS created_at,
               NULL::timestamptz AS completed_at, NULL::integer AS status, NULL::jsonb AS headers, NULL::bytea AS body
        WHERE k.expires_at <= now()
           OR (p_retry_unknown AND k.fingerprint = EXCLUDED.fingerprint
               AND (k.state = 'outcome_unknown' OR (k.state = 'in_flight' AND k.locked_until <= now())))
        UNION ALL
        -- Otherwise the record stays, except that an in-flight lock that expired
        -- unconfirmed turns into an unknown outcome.
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
  INTO v_state, v_owned, v_same, v_status, v_headers, v_body, v_retry_ms, v_age_ms;
  IF NOT v_owned AND NOT v_same THEN
    INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, body_sha256, caller, request_id, idempotency_key, trace_id)
    VALUES (p_tenant, p_route, p_entity, 'idempotency_key_reused', p_fence, NULL, p_method, p_path, p_body_sha256, p_caller, p_request_id, p_key, p_trace_id);
  END IF;
  RETURN QUERY SELECT true, v_highest::text, v_state, v_owned, v_same, v_status, v_headers, v_body, v_retry_ms, v_age_ms;
END $$;

-- fg_complete_jobs keeps its signature: its rows come from several requests of one
-- event-loop turn (src/leases/complete.ts), so each row carries its own trace_id in the JSON.
-- Otherwise 0011's.
CREATE OR REPLACE FUNCTION fg_complete_jobs(p_rows jsonb)
RETURNS TABLE (i integer, completed boolean, repeated boolean)
LANGUAGE plpgsql AS $$
DECLARE
  r record;
  current_fence bigint;
BEGIN
  FOR r IN
    SELECT * FROM jsonb_to_recordset(p_rows) AS v(
      i integer, job_id bigint, tenant text, owner text, fence bigint, result text, path text, caller text, request_id text, trace_id text)
  LOOP
    i := r.i;
    completed := false;
    repeated := false;
    UPDATE fg_jobs AS j SET state = 'succeeded', result = r.result::jsonb, lease_until = NULL, finished_at = now()
    WHERE j.id = r.job_id AND CASE WHEN j.tenant = r.tenant AND j.owner = r.owner AND j.fence = r.fence
      AND j.state = 'running' AND j.lease_until > now() AND NOT j.cancel_requested THEN true ELSE false END;
    completed := FOUND;
    IF NOT completed THEN
      -- `state = 'succeeded'` alone would prove fg_jobs_finished's predicate: the same hazard over finished jobs.
      SELECT true INTO repeated FROM fg_jobs AS j
      WHERE j.id = r.job_id AND CASE WHEN j.tenant = r.tenant AND j.owner = r.owner AND j.fence = r.fence
        AND j.state = 'succeeded' AND j.result = r.result::jsonb THEN true ELSE false END;
      repeated := coalesce(repeated, false);
      IF NOT repeated THEN
        SELECT j.fence INTO current_fence FROM fg_jobs AS j WHERE j.id = r.job_id AND j.tenant = r.tenant;
        IF FOUND THEN
          INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, caller, request_id, trace_id)
          VALUES (r.tenant, NULL, 'job:' || r.job_id, 'result_rejected', r.fence, current_fence, 'POST', r.path, r.caller, r.request_id, r.trace_id);
        END IF;
      END IF;
    END IF;
    RETURN NEXT;
  END LOOP;
END
$$;
