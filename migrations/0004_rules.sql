-- Rules at runtime: every change is a new row, so the history is the table and the
-- current rule set is the newest row per name. A NULL rule records a deletion.
-- Versions are assigned under a transaction lock (see src/rules/store.ts), so a
-- higher version always committed later and a gateway that has seen version N
-- has seen every change up to N.
CREATE TABLE fg_rule_versions (
  version    bigint      PRIMARY KEY,
  name       text        NOT NULL,
  kind       text        NOT NULL CHECK (kind IN ('route', 'entity')),
  rule       jsonb,
  changed_by text,
  changed_at timestamptz NOT NULL DEFAULT now(),
  -- Where the change came from: the admin API, the CLI (through the API) or the config file's seed.
  source     text        NOT NULL CHECK (source IN ('api', 'config'))
);
CREATE INDEX fg_rule_versions_by_name ON fg_rule_versions (name, version DESC);
