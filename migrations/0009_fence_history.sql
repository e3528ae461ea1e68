-- Every change of an entity's highest fence (first acceptance, a raise, an operator bump),
-- written by the very statement that makes the change: who moved the lease, when, how.
-- Equal fences write nothing. Ordered by id per entity: the row lock on fg_fences is held
-- from the id's allocation to the commit, so one entity's ids follow its fence's order.
CREATE TABLE fg_fence_history (
  id         bigserial   PRIMARY KEY,
  at         timestamptz NOT NULL DEFAULT now(),
  tenant     text        NOT NULL,
  entity     text        NOT NULL,
  old_fence  bigint,
  new_fence  bigint      NOT NULL,
  source     text        NOT NULL CHECK (source IN ('command', 'bump')),
  route      text,
  caller     text,
  request_id text
);
CREATE INDEX fg_fence_history_by_entity ON fg_fence_history (tenant, entity, id DESC);
CREATE INDEX fg_fence_history_by_at ON fg_fence_history (at);

-- The highest fence before the row's last upsert. An upsert's RETURNING sees only the new
-- row, so the upsert records the value it replaced here: that is how the same statement
-- knows whether (and from what) the fence moved. NULL right after the row's first insert.
ALTER TABLE fg_fences ADD COLUMN previous_fence bigint;
