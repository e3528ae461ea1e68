import type { Db } from './db.js'

/** A request for an entity's delivery slot: the fence it was accepted with and how long the slot may be held. */
export interface SlotRequest {
  tenant: string
  entity: string
  fence: string
  /** A gateway-made secret that lets only this request give the slot back. */
  token: string
  holdMs: number
}

/** What the slot statement decided. */
export type SlotDecision =
  | { kind: 'acquired' }
  | { kind: 'stale'; highest: string }
  | { kind: 'busy'; retryAfterMs: number }

/**
 * Takes an entity's delivery slot in one statement, under the fence row's
 * lock: only when the command's fence is still the entity's highest (a newer
 * fence accepted meanwhile makes it stale) and no other command holds an
 * unexpired slot. A slot left by a crashed gateway frees itself at
 * `inflight_until`, on the database clock.
 */
export async function acquireSlot(db: Db, s: SlotRequest): Promise<SlotDecision> {
  const [row] = await db.sql<{ highest: string; acquired: boolean; retry_after_ms: number }>`
    WITH current AS (
      SELECT highest_fence, inflight_token IS NULL OR inflight_until <= now() AS free,
             GREATEST(0, ceil(extract(epoch FROM (inflight_until - now())) * 1000))::integer AS retry_after_ms
      FROM fg_fences WHERE tenant = ${s.tenant} AND entity = ${s.entity} FOR UPDATE
    ), taken AS (
      UPDATE fg_fences f
      SET inflight_token = ${s.token}, inflight_fence = ${s.fence}::bigint, inflight_until = now() + ${s.holdMs}::bigint * interval '1 millisecond'
      FROM current
      WHERE f.tenant = ${s.tenant} AND f.entity = ${s.entity} AND current.free AND current.highest_fence = ${s.fence}::bigint
      RETURNING 1
    )
    SELECT highest_fence::text AS highest, EXISTS (SELECT 1 FROM taken) AS acquired, coalesce(retry_after_ms, 0) AS retry_after_ms FROM current`
  if (!row) return { kind: 'stale', highest: '0' }
  if (row.acquired) return { kind: 'acquired' }
  if (BigInt(row.highest) > BigInt(s.fence)) return { kind: 'stale', highest: row.highest }
  return { kind: 'busy', retryAfterMs: row.retry_after_ms }
}

/** Gives the slot back; only its holder can, and only while it still holds it. */
export async function releaseSlot(db: Db, s: Pick<SlotRequest, 'tenant' | 'entity' | 'token'>): Promise<void> {
  await db.sql`
    UPDATE fg_fences SET inflight_token = NULL, inflight_fence = NULL, inflight_until = NULL
    WHERE tenant = ${s.tenant} AND entity = ${s.entity} AND inflight_token = ${s.token}`
}
