-- Whether an audit row's trace id was chosen by the caller (security review). A request that
-- sends a valid W3C `traceparent` continues the caller's trace, so its rows name a trace id
-- the caller picked: it can name any trace it likes, another request's included, and an
-- operator who follows `GET /audit?trace_id=` must be able to tell such a row from one whose
-- trace the gateway started. true: the caller's; false: the gateway's; NULL where the row
-- names no trace, and on every row written before this migration (not known).
ALTER TABLE fg_audit ADD COLUMN trace_from_caller boolean;

-- The mark travels in the trace id itself, as `caller:<32 hex digits>` (traceIdOf,
-- src/observe/tracing.ts), and is split off here, once, for every way a row is inserted: the
-- auditing functions (fg_reserve, fg_present_fence, fg_present_fences, fg_complete_jobs) and
-- the statements that insert rows of their own pass the trace id through as text, so none of
-- them changes. Redefining them to take a second parameter would replace whatever another
-- migration made of them since 0018; this migration depends on no function body.
CREATE FUNCTION fg_audit_trace_origin() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.trace_id LIKE 'caller:%' THEN
    NEW.trace_id := substr(NEW.trace_id, 8);
    NEW.trace_from_caller := true;
  ELSE
    NEW.trace_from_caller := false;
  END IF;
  RETURN NEW;
END $$;

-- BEFORE, so the partial index fg_audit_by_trace (0016) sees the bare trace id. A row without
-- a trace does not run the function at all.
CREATE TRIGGER fg_audit_trace_origin BEFORE INSERT ON fg_audit
  FOR EACH ROW WHEN (NEW.trace_id IS NOT NULL) EXECUTE FUNCTION fg_audit_trace_origin();
