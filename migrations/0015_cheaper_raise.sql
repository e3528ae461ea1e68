-- A raise (a fence above the entity's highest) in fewer writes. pg_stat_statements on a raise
-- per call (PostgreSQL 15, one client) showed where fg_present_fence's WAL went, 7.4 records a
-- call against 3.2 for the hand-rolled upsert:
-- - the upsert on a row that exists locks it first (ON CONFLICT DO UPDATE writes a lock record,
--   then the update): 2.4 records. An UPDATE whose WHERE re-checks the fence writes 1.1; the
--   upsert stays for an entity's first fence, where there is no row to update.
-- - the history row fed three btrees: its primary key, by entity, and by time. The primary key
--   served only the purge's delete, which now goes by ctid; `at` only ever grows with the
--   table, which is what a BRIN index is for (a range per 128 pages, nothing written per row
--   once its range is past): 4.0 records became 2.6.
-- The history is the same: one row per change, written under the fence row's lock, and its
-- ids still follow one entity's fence order (the sequence is unchanged).
DROP INDEX fg_fence_history_by_at;
CREATE INDEX fg_fence_history_by_at ON fg_fence_history USING brin (at);
ALTER TABLE fg_fence_history DROP CONSTRAINT fg_fence_history_pkey;

CREATE OR REPLACE FUNCTION fg_present_fence(
  p_tenant text, p_route text, p_entity text, p_fence bigint, p_method text, p_path text,
  p_body_sha256 text, p_caller text, p_request_id text, p_key text DEFAULT NULL)
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
    INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, body_sha256, caller, request_id, idempotency_key)
    VALUES (p_tenant, p_route, p_entity, 'stale_fence', p_fence, v_highest, p_method, p_path, p_body_sha256, p_caller, p_request_id, p_key);
  END IF;
  RETURN v_highest;
END $$;
