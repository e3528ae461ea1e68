import type { JobType } from '../config/schema.js'

/**
 * Job-type settings as one JSON parameter, so statements join them without per-type SQL
 * (`jsonb_to_recordset(...) AS t(name text, lease_ms bigint, max_attempts integer, backoff_ms bigint, max_runtime_ms bigint)`).
 *
 * @example
 * db.sql`SELECT * FROM jsonb_to_recordset(${typesJson(config.job_types)}::text::jsonb) AS t(name text, lease_ms bigint)`
 */
export const typesJson = (types: JobType[]) => JSON.stringify(types.map((t) => ({
  name: t.name, lease_ms: t.lease, max_attempts: t.max_attempts, backoff_ms: t.backoff, max_runtime_ms: t.max_runtime,
})))
