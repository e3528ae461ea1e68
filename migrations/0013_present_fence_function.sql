-- Presents a fence without a key (src/store/commands.ts `presentFence`), as one function
-- call instead of one statement of CTEs. The decision is the same:
-- - The entity's highest on the read's snapshot decides a fence at or below it: an equal one
--   is accepted and writes nothing, a lower one is stale and audited.
-- - Only a fence above it (or an entity's first) goes through the upsert, whose row lock
--   re-checks it against the latest committed value (GREATEST), and a fence that moved writes
--   its history row while that lock is held (see 0009).
-- Why a function: the statement's text was 2 KB, and postgres.js rebuilds and hashes a
-- statement's whole text on every call to find its prepared statement; that cost the gateway
-- more CPU and allocation per fenced command than anything else it does. An equal fence also
-- no longer starts the executor for three INSERTs over three tables and their indexes.
CREATE FUNCTION fg_present_fence(
  p_tenant text, p_route text, p_entity text, p_fence bigint, p_method text, p_path text,
  p_body_sha256 text, p_caller text, p_request_id text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  v_highest bigint;
  v_previous bigint;
BEGIN
  SELECT highest_fence INTO v_highest FROM fg_fences WHERE tenant = p_tenant AND entity = p_entity;
  IF v_highest IS NULL OR v_highest < p_fence THEN
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
  END IF;
  IF v_highest > p_fence THEN
    INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, body_sha256, caller, request_id)
    VALUES (p_tenant, p_route, p_entity, 'stale_fence', p_fence, v_highest, p_method, p_path, p_body_sha256, p_caller, p_request_id);
  END IF;
  RETURN v_highest;
END $$;
