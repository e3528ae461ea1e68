import type { Db } from './db.js'

/** An operator's request to raise an entity's fence floor. */
export interface Bump {
  tenant: string
  entity: string
  minFence: string
  caller: string | null
  requestId: string
  /** The trace of the admin request that bumped, for its audit row; null or absent when untraced. */
  traceId?: string | null
}

/** What a bump did: the highest fence before and after; `raised` is false when it was already at or above. */
export interface BumpResult {
  previous: string | null
  highest: string
  raised: boolean
}

/**
 * Raises the highest accepted fence of an entity to at least `minFence`, in
 * one statement: the row is locked (the upsert's own lock, which also
 * reports the value it replaced), raised with GREATEST (a bump never lowers
 * a fence) and the bump is audited as `fence_bumped` with who asked. Every
 * holder of a lower token is stale from the commit on; a holder of exactly
 * `minFence` is still accepted, as an equal fence always is. A bump that
 * raises also writes the entity's fence history (source `bump`).
 */
export async function bumpFence(db: Db, b: Bump): Promise<BumpResult> {
  const [row] = await db.sql<{ previous: string | null; highest: string }>`
    WITH raised AS (
      INSERT INTO fg_fences AS f (tenant, entity, highest_fence, updated_at, request_id)
      VALUES (${b.tenant}, ${b.entity}, ${b.minFence}::bigint, now(), ${b.requestId})
      ON CONFLICT (tenant, entity) DO UPDATE
        SET highest_fence = GREATEST(f.highest_fence, EXCLUDED.highest_fence),
            updated_at = CASE WHEN EXCLUDED.highest_fence > f.highest_fence THEN now() ELSE f.updated_at END,
            request_id = CASE WHEN EXCLUDED.highest_fence > f.highest_fence THEN EXCLUDED.request_id ELSE f.request_id END,
            previous_fence = f.highest_fence
      RETURNING highest_fence, previous_fence
    ), moved AS (
      -- The fence's history, by the statement that moved it (see fence-history.ts).
      INSERT INTO fg_fence_history (tenant, entity, old_fence, new_fence, source, route, caller, request_id)
      SELECT ${b.tenant}, ${b.entity}, previous_fence, highest_fence, 'bump', NULL, ${b.caller}, ${b.requestId}
      FROM raised WHERE previous_fence IS NULL OR highest_fence > previous_fence
      RETURNING id
    ), audited AS (
      INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, caller, request_id, trace_id)
      SELECT ${b.tenant}, NULL, ${b.entity}, 'fence_bumped', ${b.minFence}::bigint, (SELECT previous_fence FROM raised),
             'POST', '/entities/bump', ${b.caller}, ${b.requestId}, ${b.traceId}::text
      RETURNING id
    )
    SELECT (SELECT previous_fence FROM raised)::text AS previous, (SELECT highest_fence FROM raised)::text AS highest
    FROM (SELECT count(*) FROM audited) AS written`
  const previous = row!.previous
  return { previous, highest: row!.highest, raised: previous === null || BigInt(row!.highest) > BigInt(previous) }
}
