-- A raise in fewer instructions (issue 28 item 4). callgrind on a backend (PostgreSQL 15,
-- single-user mode, 2,000 raises after 500, one per transaction) counted 401k instructions
-- per raise under 0015, against 139k for the hand-rolled upsert; of the raise's:
-- - 27k went to the history's CHECK (source IN ('command', 'bump')) and 14k to fg_fences'
--   CHECK (highest_fence >= 0). A table's CHECK is read back from its stored text, planned and
--   compiled by every statement that writes the table (ExecRelCheck), and the IN list's
--   array is built by evaluating it each time. An enum checks the value once, when the
--   statement's constant is parsed: 0 per row. A domain's check comes planned from the type
--   cache: 4k where the CHECK took 14k.
-- - ~20k went to the UPDATE's second descent of the primary key, to the row the read had just
--   found. It now goes to that row by its ctid (a TID scan), re-checking the key and the fence
--   on it; when the row has moved since the read (another command updated it, or a HOT
--   update gave it a new ctid), the ctid finds nothing and the UPDATE by key runs as before.
-- - fg_fences kept 100% fillfactor: every 5th raise found no room on the row's page for a HOT
--   update, and wrote the primary key too. 70% leaves room for the next version (new pages;
--   existing ones until they are rewritten).
-- Left as it is: the history's btree (the admin plane reads one entity's changes by it) and
-- its BRIN on `at` (11k a row: the every-minute purge would otherwise scan the whole table).
-- The decisions are those of 0015 and 0016 (the audit row's trace id): the same rows, written
-- under the same locks. The signature is 0016's, so CREATE OR REPLACE replaces it.
CREATE TYPE fg_fence_source AS ENUM ('command', 'bump');
ALTER TABLE fg_fence_history
  DROP CONSTRAINT fg_fence_history_source_check,
  ALTER COLUMN source TYPE fg_fence_source USING source::fg_fence_source;

CREATE DOMAIN fg_fence AS bigint CHECK (VALUE >= 0);
ALTER TABLE fg_fences
  DROP CONSTRAINT fg_fences_highest_fence_check,
  ALTER COLUMN highest_fence TYPE fg_fence;
ALTER TABLE fg_fences SET (fillfactor = 70);

CREATE OR REPLACE FUNCTION fg_present_fence(
  p_tenant text, p_route text, p_entity text, p_fence bigint, p_method text, p_path text,
  p_body_sha256 text, p_caller text, p_request_id text, p_key text DEFAULT NULL, p_trace_id text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  v_highest bigint;
  v_previous bigint;
  v_row tid;
BEGIN
  -- highest_fence::bigint: the column's domain, read as its base type in the statement's own
  -- (cached) plan; into a bigint variable PL/pgSQL would build that cast again in every transaction.
  SELECT highest_fence::bigint, ctid INTO v_highest, v_row FROM fg_fences WHERE tenant = p_tenant AND entity = p_entity;
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
    RETURNING highest_fence::bigint, previous_fence INTO v_highest, v_previous;
    IF v_previous IS NULL OR v_highest > v_previous THEN
      INSERT INTO fg_fence_history (tenant, entity, old_fence, new_fence, source, route, caller, request_id)
      VALUES (p_tenant, p_entity, v_previous, v_highest, 'command', p_route, p_caller, p_request_id);
    END IF;
  ELSIF v_highest < p_fence THEN
    -- A raise, on the row the read found. Its WHERE re-checks the key (a ctid may be reused by
    -- another row once the old one is pruned) and the fence, on the latest committed version
    -- (READ COMMITTED re-reads a row another raise changed).
    UPDATE fg_fences AS f
      SET highest_fence = p_fence, updated_at = now(), request_id = p_request_id, previous_fence = f.highest_fence
      WHERE f.ctid = v_row AND f.tenant = p_tenant AND f.entity = p_entity AND f.highest_fence < p_fence
      RETURNING f.previous_fence INTO v_previous;
    IF NOT FOUND THEN
      -- The row moved since the read: by its key.
      UPDATE fg_fences AS f
        SET highest_fence = p_fence, updated_at = now(), request_id = p_request_id, previous_fence = f.highest_fence
        WHERE f.tenant = p_tenant AND f.entity = p_entity AND f.highest_fence < p_fence
        RETURNING f.previous_fence INTO v_previous;
    END IF;
    IF FOUND THEN
      v_highest := p_fence;
      INSERT INTO fg_fence_history (tenant, entity, old_fence, new_fence, source, route, caller, request_id)
      VALUES (p_tenant, p_entity, v_previous, p_fence, 'command', p_route, p_caller, p_request_id);
    ELSE
      -- Raised to at least p_fence meanwhile: its value now decides (equal accepted, higher stale).
      SELECT highest_fence::bigint INTO v_highest FROM fg_fences WHERE tenant = p_tenant AND entity = p_entity;
    END IF;
  END IF;
  IF v_highest > p_fence THEN
    INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, body_sha256, caller, request_id, idempotency_key, trace_id)
    VALUES (p_tenant, p_route, p_entity, 'stale_fence', p_fence, v_highest, p_method, p_path, p_body_sha256, p_caller, p_request_id, p_key, p_trace_id);
  END IF;
  RETURN v_highest;
END $$;
