-- Who holds a lease, in a form no token can forge (the security issue's items 4 and 5).
--
-- A `fence: lease` route accepted the live fence from any client of the tenant, and fences are
-- small sequential numbers: a token with no scopes guessed one on its third try and was
-- forwarded during another worker's live lease. And the job API compared only the worker id,
-- whose slot rule (`sub/…`) let a token whose sub is `svc` act as `svc/payments`, a worker whose
-- own token's sub is `svc/payments`.
--
-- A claim now records the claiming token's sub in owner_sub (NULL without auth, where no
-- subject is verified), and every holder check compares it exactly, with IS NOT DISTINCT FROM
-- so that NULL (no auth) matches only NULL: the lease check of fg_reserve against the
-- command's caller (the token's sub, as the audit rows name it), and completions here against
-- each row's `sub`. The other holder statements (heartbeat, append, fail, release) compare it in
-- src/leases/store.ts. Jobs running when this applies have no owner_sub: under auth their holder
-- is refused until the lease ends and the next claim records one.
ALTER TABLE fg_jobs ADD COLUMN owner_sub text;

-- A new parameter with CREATE OR REPLACE would be a second function beside the old one: the
-- old signature is dropped first. fg_reserve calls it by name at run time, so the order does not matter.
DROP FUNCTION fg_lease_live(text, bigint, bigint);
CREATE FUNCTION fg_lease_live(p_tenant text, p_job bigint, p_fence bigint, p_sub text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN EXISTS (
    SELECT 1 FROM fg_jobs
    WHERE id = p_job AND CASE WHEN tenant = p_tenant AND fence = p_fence AND owner_sub IS NOT DISTINCT FROM p_sub
      AND state = 'running' AND lease_until > now() AND NOT cancel_requested THEN true ELSE false END);
END
$$;

-- 0016's, with only the lease check's subject added; the signature is the same.
CREATE OR REPLACE FUNCTION fg_reserve(
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

-- 0016's, with each row's `sub` compared to the job's owner_sub.
CREATE OR REPLACE FUNCTION fg_complete_jobs(p_rows jsonb)
RETURNS TABLE (i integer, completed boolean, repeated boolean)
LANGUAGE plpgsql AS $$
DECLARE
  r record;
  current_fence bigint;
BEGIN
  FOR r IN
    SELECT * FROM jsonb_to_recordset(p_rows) AS v(
      i integer, job_id bigint, tenant text, owner text, sub text, fence bigint, result text, path text, caller text, request_id text, trace_id text)
  LOOP
    i := r.i;
    completed := false;
    repeated := false;
    UPDATE fg_jobs AS j SET state = 'succeeded', result = r.result::jsonb, lease_until = NULL, finished_at = now()
    WHERE j.id = r.job_id AND CASE WHEN j.tenant = r.tenant AND j.owner = r.owner AND j.owner_sub IS NOT DISTINCT FROM r.sub AND j.fence = r.fence
      AND j.state = 'running' AND j.lease_until > now() AND NOT j.cancel_requested THEN true ELSE false END;
    completed := FOUND;
    IF NOT completed THEN
      -- `state = 'succeeded'` alone would prove fg_jobs_finished's predicate: the same hazard over finished jobs.
      SELECT true INTO repeated FROM fg_jobs AS j
      WHERE j.id = r.job_id AND CASE WHEN j.tenant = r.tenant AND j.owner = r.owner AND j.owner_sub IS NOT DISTINCT FROM r.sub AND j.fence = r.fence
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
