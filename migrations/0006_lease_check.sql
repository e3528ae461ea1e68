-- Whether a fence is the current token of a running job on an unexpired lease.
-- The reserve statement calls it only for lease-bound commands: as a plpgsql
-- function its query is planned and its tables locked only when it runs, so the
-- statement every other idempotent command takes does not carry the job table.
CREATE FUNCTION fg_lease_live(p_tenant text, p_job bigint, p_fence bigint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN EXISTS (
    SELECT 1 FROM fg_jobs
    WHERE tenant = p_tenant AND id = p_job AND fence = p_fence
      AND state = 'running' AND lease_until > now() AND NOT cancel_requested);
END
$$;
