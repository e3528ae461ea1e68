-- The fences of one event-loop turn in one statement and one transaction (issue 28 item 4,
-- src/store/present.ts): one round trip, one commit and one flush for all of them, where a
-- raise of its own paid each. Each command is decided by fg_present_fence exactly as alone, in
-- the order given; the caller orders them by (tenant, entity), keeping arrival order within
-- an entity, so every batch takes its row locks in one order and no two batches deadlock.
--
-- A PL/pgSQL function, not a SELECT over jsonb_to_recordset: its RETURN NEXT rows are kept
-- until it returns, so a command refused on its row (SQLSTATE class 22 or 23) fails the
-- statement before any row is sent. postgres.js 3.4.9 does not reset its row index on an
-- error that follows rows, and the next statement on that connection came back with a hole
-- where its first row belonged (test/present-batch.test.ts).
--
-- `lsn`: the WAL insert position after the command's writes, NULL while the transaction has
-- written nothing (an equal or lower fence before any raise), as the single statement reads it.
CREATE FUNCTION fg_present_fences(p_commands jsonb)
RETURNS TABLE (i int, highest bigint, lsn text)
LANGUAGE plpgsql AS $$
DECLARE
  c record;
BEGIN
  FOR c IN SELECT * FROM jsonb_to_recordset(p_commands) AS u(i int, tenant text, route text, entity text,
      fence bigint, method text, path text, body_sha256 text, caller text, request_id text, trace_id text) LOOP
    i := c.i;
    highest := fg_present_fence(c.tenant, c.route, c.entity, c.fence, c.method, c.path, c.body_sha256, c.caller,
      c.request_id, p_trace_id => c.trace_id);
    lsn := CASE WHEN pg_current_xact_id_if_assigned() IS NOT NULL THEN pg_current_wal_insert_lsn()::text END;
    RETURN NEXT;
  END LOOP;
END $$;
