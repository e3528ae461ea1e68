-- One row per (tenant, Idempotency-Key): reserved in the same statement that
-- accepts the fence, before anything is forwarded; completed with the response.
CREATE TABLE fg_idempotency (
  tenant        text        NOT NULL,
  key           text        NOT NULL,
  -- SHA-256 over method, route, path, query and raw body: the payload's identity.
  fingerprint   text        NOT NULL,
  route         text        NOT NULL,
  state         text        NOT NULL CHECK (state IN ('in_flight', 'completed', 'outcome_unknown', 'not_replayable')),
  entity        text,
  fence         bigint,
  -- An in-flight record unconfirmed past this time is an unknown outcome.
  locked_until  timestamptz,
  -- Past this time the key is free again and the row may be purged.
  expires_at    timestamptz NOT NULL,
  -- Names the one request that may complete or release the record (never client-supplied).
  owner_token   text        NOT NULL,
  request_id    text        NOT NULL,
  attempt       integer     NOT NULL DEFAULT 1,
  status        integer,
  headers       jsonb,
  body          bytea,
  created_at    timestamptz NOT NULL DEFAULT now(),
  completed_at  timestamptz,
  PRIMARY KEY (tenant, key)
);
CREATE INDEX fg_idempotency_expiry ON fg_idempotency (expires_at);

-- Rejections about a key (reuse with another payload, operator release) name it.
ALTER TABLE fg_audit ADD COLUMN idempotency_key text;
