import type { Db } from './db.js'

/**
 * fg_fence_history: one row per change of an entity's highest fence. The rows
 * are written by the statements that change the fence (reserve in commands.ts,
 * bumpFence in fences.ts), never from here: this module reads and purges them.
 */

/** One change of an entity's highest fence, as the admin plane shows it. */
export interface FenceChange {
  id: string
  at: string
  tenant: string
  entity: string
  /** The highest fence before the change; null when this was the entity's first accepted fence. */
  old_fence: string | null
  new_fence: string
  /** `command`: a request's fence raised it; `bump`: an operator's bump did. */
  source: 'command' | 'bump'
  route: string | null
  caller: string | null
  request_id: string | null
}

/** Which changes to read: one entity's, newest first, below the `before` id when paging. */
export interface FenceHistoryQuery {
  tenant: string
  entity: string
  limit: number
  before?: string | undefined
}

/**
 * Reads one entity's fence history, newest first, ordered by the numeric id.
 *
 * @example
 * const page = await listFenceHistory(db, { tenant: 'default', entity: 'invoice:7', limit: 50 })
 */
export async function listFenceHistory(db: Db, q: FenceHistoryQuery): Promise<FenceChange[]> {
  return db.sql<FenceChange>`
    SELECT id::text AS id, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS at, tenant, entity,
           old_fence::text AS old_fence, new_fence::text AS new_fence, source::text AS source, route, caller, request_id
    FROM fg_fence_history
    WHERE tenant = ${q.tenant} AND entity = ${q.entity}
      AND (${q.before}::bigint IS NULL OR id < ${q.before}::bigint)
    ORDER BY fg_fence_history.id DESC
    LIMIT ${q.limit}`
}

/**
 * Deletes up to `limit` history rows older than `olderThanMs` on the database
 * clock; returns how many went. Bounded, so a purge never holds locks or bloats
 * a transaction for long: call it again while it returns `limit`. By ctid: the
 * table has no index on id, and `at` has a BRIN index (migrations/0015), which
 * finds old rows by the ranges of pages they sit in, in no particular order.
 */
export async function purgeFenceHistory(db: Db, olderThanMs: number, limit: number): Promise<number> {
  const rows = await db.sql`
    DELETE FROM fg_fence_history WHERE ctid = ANY (ARRAY(
      SELECT ctid FROM fg_fence_history WHERE at < now() - ${olderThanMs}::bigint * interval '1 millisecond'
      LIMIT ${limit}
    ))
    RETURNING 1`
  return rows.length
}
