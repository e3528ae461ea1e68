-- Ordered delivery (route option `ordering: serialize`): at most one forwarded command
-- per entity at a time. The slot lives on the fence row, so taking it can re-check in
-- one statement that the command's fence is still the entity's highest.
ALTER TABLE fg_fences
  ADD COLUMN inflight_token text,
  ADD COLUMN inflight_fence bigint,
  ADD COLUMN inflight_until timestamptz;
