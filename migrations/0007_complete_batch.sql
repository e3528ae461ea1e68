-- Completes a batch of idempotency records in one statement (one round trip, one
-- commit) for the completions that finished in the same event-loop turn. Each row
-- is the same single-record UPDATE a lone completion runs: it applies only while
-- that request still owns the in-flight record. A loop rather than one UPDATE ... FROM
-- on purpose: joined to a set of rows, the planner picks a hash join over a scan of
-- the whole table when it believes the table small, and keeps that plan as it grows;
-- each lookup here is by primary key, whatever the statistics say.
-- p_rows: [{i, tenant, key, owner_token, replayable, status, headers, offset, length, ttl_ms}]; a row
-- that is not replayable (its answer was too large) becomes not_replayable, with no body;
-- p_bodies: the replayable bodies, concatenated; a row's body is its [offset, offset + length) slice.
-- Returns the i of every row that applied.
CREATE FUNCTION fg_complete(p_rows jsonb, p_bodies bytea) RETURNS SETOF integer
LANGUAGE plpgsql AS $$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT * FROM jsonb_to_recordset(p_rows) AS v(
      i integer, tenant text, key text, owner_token text, replayable boolean,
      status integer, headers jsonb, "offset" integer, length integer, ttl_ms bigint)
  LOOP
    UPDATE fg_idempotency
    SET state = CASE WHEN r.replayable THEN 'completed' ELSE 'not_replayable' END, status = r.status, headers = r.headers,
        body = CASE WHEN r.replayable THEN substring(p_bodies FROM r."offset" + 1 FOR r.length) END,
        completed_at = now(), locked_until = NULL, expires_at = now() + r.ttl_ms * interval '1 millisecond'
    WHERE tenant = r.tenant AND key = r.key AND owner_token = r.owner_token AND state = 'in_flight';
    IF FOUND THEN
      RETURN NEXT r.i;
    END IF;
  END LOOP;
END
$$;
