-- Reserves a command's fence and key (src/store/commands.ts `reserve`), as one statement
-- did before: the same CTEs, decided the same way. As a function it gets two things the
-- statement could not have:
-- - A replay is answered by a read alone. The read runs first; only when there is nothing to
--   replay does the function run the statement that may write. A replay no longer starts the
--   executor for six INSERTs over four tables and their eleven indexes, which cost it more
--   PostgreSQL CPU than the hand-rolled fence's whole write.
-- - Each value is bound once: the statement took 119 parameters for 16 values.
-- The replay's read and the statement each take their own snapshot. A key completed between
-- the two is still answered as a replay by the statement (the `reserved` CTE finds it).
CREATE FUNCTION fg_reserve(
  p_tenant text, p_route text, p_entity text, p_fence bigint, p_method text, p_path text,
  p_body_sha256 text, p_caller text, p_request_id text, p_key text, p_fingerprint text,
  p_owner_token text, p_lock_ms bigint, p_ttl_ms bigint, p_retry_unknown boolean, p_lease_job bigint)
RETURNS TABLE (lease_ok boolean, highest text, state text, owned boolean, same_payload boolean,
               status integer, headers text, body bytea, retry_after_ms integer, age_ms integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
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
  RETURN QUERY
      WITH current AS (
        -- The entity's highest fence on the statement's snapshot: a fence at or below it is
        -- decided by this read alone (see presentFence).
        SELECT highest_fence FROM fg_fences WHERE tenant = p_tenant AND entity = p_entity
      ), lease AS (
        -- A function, so that the job table is planned and locked only for lease-bound commands:
        -- carrying it in every key's statement cost PostgreSQL a fifth of the statement's CPU.
        SELECT CASE WHEN p_lease_job::bigint IS NULL THEN true
                    ELSE fg_lease_live(p_tenant, p_lease_job::bigint, p_fence::bigint) END AS live
      ), lease_refused AS (
        INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, method, path, body_sha256, caller, request_id, idempotency_key)
        SELECT p_tenant, p_route, p_entity, 'lease_expired', p_fence::bigint, p_method, p_path, p_body_sha256, p_caller, p_request_id, p_key
        FROM lease WHERE NOT live
        RETURNING id
      ), decided AS (
        INSERT INTO fg_fences AS f (tenant, entity, highest_fence, updated_at, request_id)
        SELECT p_tenant, p_entity, p_fence::bigint, now(), p_request_id
        WHERE p_fence::bigint IS NOT NULL AND (SELECT live FROM lease)
          AND NOT EXISTS (SELECT 1 FROM current WHERE highest_fence >= p_fence::bigint)
        ON CONFLICT (tenant, entity) DO UPDATE
          SET highest_fence = GREATEST(f.highest_fence, EXCLUDED.highest_fence),
              updated_at = CASE WHEN EXCLUDED.highest_fence >= f.highest_fence THEN now() ELSE f.updated_at END,
              request_id = CASE WHEN EXCLUDED.highest_fence >= f.highest_fence THEN EXCLUDED.request_id ELSE f.request_id END,
              previous_fence = f.highest_fence
        RETURNING highest_fence, previous_fence
      ), outcome AS (
        -- One row for a fenced command under a live lease: the upsert's answer, or the snapshot's.
        SELECT highest_fence FROM decided
        UNION ALL
        SELECT highest_fence FROM current WHERE highest_fence >= p_fence::bigint AND (SELECT live FROM lease)
      ), moved AS (
        -- The fence's history, by the statement that moved it (see fence-history.ts).
        INSERT INTO fg_fence_history (tenant, entity, old_fence, new_fence, source, route, caller, request_id)
        SELECT p_tenant, p_entity, previous_fence, highest_fence, 'command', p_route, p_caller, p_request_id
        FROM decided WHERE previous_fence IS NULL OR highest_fence > previous_fence
        RETURNING id
      ), stale AS (
        INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, body_sha256, caller, request_id, idempotency_key)
        SELECT p_tenant, p_route, p_entity, 'stale_fence', p_fence::bigint, highest_fence,
               p_method, p_path, p_body_sha256, p_caller, p_request_id, p_key
        FROM outcome WHERE highest_fence > p_fence::bigint
        RETURNING id
      ), reserved AS (
        INSERT INTO fg_idempotency AS k (tenant, key, fingerprint, route, state, entity, fence, locked_until, expires_at, owner_token, request_id)
        SELECT p_tenant, p_key, p_fingerprint, p_route, 'in_flight', p_entity, p_fence::bigint,
               now() + p_lock_ms::bigint * interval '1 millisecond',
               now() + (p_lock_ms::bigint + p_ttl_ms::bigint) * interval '1 millisecond',
               p_owner_token, p_request_id
        WHERE p_key::text IS NOT NULL AND NOT EXISTS (SELECT 1 FROM stale) AND NOT EXISTS (SELECT 1 FROM lease_refused)
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
                 OR (p_retry_unknown::boolean AND k.fingerprint = EXCLUDED.fingerprint
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
        RETURNING k.state, k.owner_token = p_owner_token AS owned, k.fingerprint = p_fingerprint AS same_payload,
                  k.status, k.headers::text AS headers, k.body,
                  GREATEST(0, ceil(extract(epoch FROM (k.locked_until - now())) * 1000))::integer AS retry_after_ms,
                  GREATEST(0, floor(extract(epoch FROM (now() - k.created_at)) * 1000))::integer AS age_ms
      ), reused AS (
        INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, body_sha256, caller, request_id, idempotency_key)
        SELECT p_tenant, p_route, p_entity, 'idempotency_key_reused', p_fence::bigint, NULL,
               p_method, p_path, p_body_sha256, p_caller, p_request_id, p_key
        FROM reserved WHERE NOT owned AND NOT same_payload
        RETURNING id
      )
      SELECT NOT EXISTS (SELECT 1 FROM lease_refused), (SELECT highest_fence::text FROM outcome), r.state, r.owned, r.same_payload, r.status, r.headers, r.body, r.retry_after_ms, r.age_ms
      FROM (SELECT 1) AS one LEFT JOIN reserved AS r ON true;
END $$;
