-- A statement about one job's lease must reach the row by its primary key. Written as
-- plain ANDs, `state = 'running' AND lease_until > now()` matches the partial index
-- fg_jobs_expiring (0008), and on statistics taken while few jobs ran (a backlog seeded
-- and analyzed, a table PGlite never analyzes) the planner takes that index as the
-- cheaper path: it then walks every entry of the tenant whose lease ends in the future,
-- including the dead entry each completed job leaves there until vacuum. That made the
-- completion of one job read 18 buffers after 1,000 completions and 121 after 20,000
-- (docs/leases.md, "Performance at depth"). The holder's conditions are therefore one
-- CASE, which the planner treats as a filter on the row found, never as an access path
-- or as proof of an index's predicate (the claim's UPDATE does the same, src/leases/claim.ts).
-- The conditions themselves are unchanged.

CREATE OR REPLACE FUNCTION fg_lease_live(p_tenant text, p_job bigint, p_fence bigint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN EXISTS (
    SELECT 1 FROM fg_jobs
    WHERE id = p_job AND CASE WHEN tenant = p_tenant AND fence = p_fence
      AND state = 'running' AND lease_until > now() AND NOT cancel_requested THEN true ELSE false END);
END
$$;

-- As in 0010, row by row; only the WHERE clauses changed.
CREATE OR REPLACE FUNCTION fg_complete_jobs(p_rows jsonb)
RETURNS TABLE (i integer, completed boolean, repeated boolean)
LANGUAGE plpgsql AS $$
DECLARE
  r record;
  current_fence bigint;
BEGIN
  FOR r IN
    SELECT * FROM jsonb_to_recordset(p_rows) AS v(
      i integer, job_id bigint, tenant text, owner text, fence bigint, result text, path text, caller text, request_id text)
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
          INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, caller, request_id)
          VALUES (r.tenant, NULL, 'job:' || r.job_id, 'result_rejected', r.fence, current_fence, 'POST', r.path, r.caller, r.request_id);
        END IF;
      END IF;
    END IF;
    RETURN NEXT;
  END LOOP;
END
$$;
