-- Completes a batch of jobs in one statement (one round trip, one commit) for the
-- completions that finished in the same event-loop turn. Each row is decided exactly as a
-- lone completion was: it completes the job only under its holder's live, uncancelled
-- lease; again with the same fence and result it is a repeat (a no-op success); any other
-- completion of an existing job changes nothing and is audited as result_rejected.
-- A loop rather than one UPDATE ... FROM on purpose (see 0007): joined to a set of rows,
-- the planner scanned the whole job table, 8 ms per job at 20,000 queued; each lookup here
-- is by primary key. Rows run in order, so a job completed twice in one batch sees the
-- first completion.
-- p_rows: [{i, job_id, tenant, owner, fence, result (JSON text), path, caller, request_id}].
CREATE FUNCTION fg_complete_jobs(p_rows jsonb)
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
    WHERE j.id = r.job_id AND j.tenant = r.tenant AND j.owner = r.owner AND j.fence = r.fence
      AND j.state = 'running' AND j.lease_until > now() AND NOT j.cancel_requested;
    completed := FOUND;
    IF NOT completed THEN
      SELECT true INTO repeated FROM fg_jobs AS j
      WHERE j.id = r.job_id AND j.tenant = r.tenant AND j.owner = r.owner AND j.fence = r.fence
        AND j.state = 'succeeded' AND j.result = r.result::jsonb;
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
