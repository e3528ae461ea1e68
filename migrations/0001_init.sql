-- The highest accepted fence per (tenant, entity). One row per entity; every
-- acceptance is a single upsert that re-checks the stored value under its row lock.
CREATE TABLE fg_fences (
  tenant        text        NOT NULL,
  entity        text        NOT NULL,
  highest_fence bigint      NOT NULL CHECK (highest_fence >= 0),
  updated_at    timestamptz NOT NULL DEFAULT now(),
  -- The request whose fence set highest_fence last: what an operator asks first.
  request_id    text        NOT NULL,
  PRIMARY KEY (tenant, entity)
);

-- Every rejected command. Identifiers and hashes only: never a body or a header value
-- beyond the fence itself.
CREATE TABLE fg_audit (
  id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at              timestamptz NOT NULL DEFAULT now(),
  tenant          text        NOT NULL,
  route           text,
  entity          text,
  code            text        NOT NULL,
  presented_fence bigint,
  highest_fence   bigint,
  method          text        NOT NULL,
  path            text        NOT NULL,
  body_sha256     text,
  caller          text,
  request_id      text        NOT NULL
);
CREATE INDEX fg_audit_by_tenant ON fg_audit (tenant, id DESC);
CREATE INDEX fg_audit_by_entity ON fg_audit (tenant, entity, id DESC);
CREATE INDEX fg_audit_by_at ON fg_audit (at DESC);
