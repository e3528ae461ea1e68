import type { Db } from './db.js'

/**
 * fg_audit's home: every statement that inserts a rejection on its own, reads
 * the trail, counts it or purges it. (The reserve and bump statements audit in
 * their own CTEs, so a rejection costs them no second round trip.)
 */

/** One rejected command, as written to the audit table. */
export interface Rejection {
  tenant: string
  route: string | null
  entity: string | null
  code: string
  presentedFence: string | null
  highestFence: string | null
  method: string
  path: string
  bodySha256: string | null
  caller: string | null
  requestId: string
  idempotencyKey?: string | null
  /**
   * The trace of the request that was refused (32 lowercase hex digits, marked `caller:` when
   * the caller chose it: `traceIdOf`); null or absent when it had none.
   */
  traceId?: string | null
}

/** Filters shared by reading the audit trail and counting it. Times are on the database clock. */
export interface AuditFilter {
  tenant?: string | undefined
  entity?: string | undefined
  code?: string | undefined
  route?: string | undefined
  caller?: string | undefined
  /** Only rows of this trace (32 lowercase hex digits). */
  traceId?: string | undefined
  /** ISO timestamp or, with sinceMs, a window ending at the database's now(). */
  since?: string | undefined
  sinceMs?: number | undefined
  until?: string | undefined
  untilMs?: number | undefined
}

/** Filters for reading the audit trail, newest first. */
export interface AuditQuery extends AuditFilter {
  limit: number
  /** Return rows with an id below this one (keyset pagination). */
  before?: string | undefined
}

export interface AuditItem {
  id: string
  at: string
  tenant: string
  route: string | null
  entity: string | null
  code: string
  presented_fence: string | null
  highest_fence: string | null
  method: string
  path: string
  body_sha256: string | null
  caller: string | null
  request_id: string
  idempotency_key: string | null
  /** The trace of the request that caused the row; null when it had none (tracing off, or before migration 0016). */
  trace_id: string | null
  /**
   * Whether `trace_id` is one the caller chose (its `traceparent`), not one the gateway
   * started: a caller can name any trace, another request's included. Null without a trace
   * id, and on rows written before migration 0020.
   */
  trace_from_caller: boolean | null
}

/** Rejections of one code in one time bucket; `at` is the bucket's start. */
export interface AuditBucket {
  at: string
  code: string
  count: number
}

export async function recordRejection(db: Db, r: Rejection): Promise<void> {
  await db.sql`
    INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence,
                          method, path, body_sha256, caller, request_id, idempotency_key, trace_id)
    VALUES (${r.tenant}, ${r.route}, ${r.entity}, ${r.code}, ${r.presentedFence}::bigint, ${r.highestFence}::bigint,
            ${r.method}, ${r.path}, ${r.bodySha256}, ${r.caller}, ${r.requestId}, ${r.idempotencyKey}, ${r.traceId})`
}

export async function listAudit(db: Db, q: AuditQuery): Promise<AuditItem[]> {
  return db.sql<AuditItem>`
    SELECT id::text, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS at, tenant, route, entity, code,
           presented_fence::text, highest_fence::text, method, path, body_sha256, caller, request_id, idempotency_key, trace_id,
           trace_from_caller
    FROM fg_audit
    WHERE (${q.tenant}::text IS NULL OR tenant = ${q.tenant})
      AND (${q.entity}::text IS NULL OR entity = ${q.entity})
      AND (${q.code}::text IS NULL OR code = ${q.code})
      AND (${q.route}::text IS NULL OR route = ${q.route})
      AND (${q.caller}::text IS NULL OR caller = ${q.caller})
      AND (${q.traceId}::text IS NULL OR trace_id = ${q.traceId})
      AND (${q.since}::timestamptz IS NULL OR at >= ${q.since}::timestamptz)
      AND (${q.sinceMs}::bigint IS NULL OR at >= now() - ${q.sinceMs}::bigint * interval '1 millisecond')
      AND (${q.until}::timestamptz IS NULL OR at < ${q.until}::timestamptz)
      AND (${q.untilMs}::bigint IS NULL OR at < now() - ${q.untilMs}::bigint * interval '1 millisecond')
      AND (${q.before}::bigint IS NULL OR id < ${q.before}::bigint)
    ORDER BY fg_audit.id DESC
    LIMIT ${q.limit}`
}

// A chart needs no more: 24 hours by the minute is 1440 buckets, times a handful of codes.
const maxBucketRows = 20_000

/**
 * Counts rejections by code per time bucket of `bucketMs`, buckets aligned to
 * the Unix epoch on the database clock, oldest first. Empty buckets are absent.
 *
 * @example
 * const buckets = await summarizeAudit(db, { sinceMs: 3_600_000 }, 60_000)
 */
export async function summarizeAudit(db: Db, q: AuditFilter, bucketMs: number): Promise<AuditBucket[]> {
  const rows = await db.sql<{ bucket: string; code: string; count: number }>`
    SELECT (floor(extract(epoch FROM at) * 1000 / ${bucketMs}::bigint)::bigint * ${bucketMs}::bigint)::text AS bucket,
           code, count(*)::integer AS count
    FROM fg_audit
    WHERE (${q.tenant}::text IS NULL OR tenant = ${q.tenant})
      AND (${q.entity}::text IS NULL OR entity = ${q.entity})
      AND (${q.code}::text IS NULL OR code = ${q.code})
      AND (${q.route}::text IS NULL OR route = ${q.route})
      AND (${q.caller}::text IS NULL OR caller = ${q.caller})
      AND (${q.traceId}::text IS NULL OR trace_id = ${q.traceId})
      AND (${q.since}::timestamptz IS NULL OR at >= ${q.since}::timestamptz)
      AND (${q.sinceMs}::bigint IS NULL OR at >= now() - ${q.sinceMs}::bigint * interval '1 millisecond')
      AND (${q.until}::timestamptz IS NULL OR at < ${q.until}::timestamptz)
      AND (${q.untilMs}::bigint IS NULL OR at < now() - ${q.untilMs}::bigint * interval '1 millisecond')
    GROUP BY 1, 2
    ORDER BY min(at), code
    LIMIT ${maxBucketRows}`
  return rows.map((r) => ({ at: new Date(Number(r.bucket)).toISOString(), code: r.code, count: Number(r.count) }))
}

/**
 * Deletes up to `limit` audit rows older than `olderThanMs` on the database
 * clock, oldest first; returns how many went (see purgeFenceHistory).
 */
export async function purgeAudit(db: Db, olderThanMs: number, limit: number): Promise<number> {
  const rows = await db.sql`
    DELETE FROM fg_audit WHERE id = ANY (ARRAY(
      SELECT id FROM fg_audit WHERE at < now() - ${olderThanMs}::bigint * interval '1 millisecond'
      ORDER BY at LIMIT ${limit}
    ))
    RETURNING 1`
  return rows.length
}
