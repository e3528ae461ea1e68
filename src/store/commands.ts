import type { Db } from './db.js'

/** A command presented to the store before forwarding: its fence, and its key when idempotent. */
export interface Command {
  tenant: string
  route: string
  /** The entity whose fence is presented, or null when the request carries no fence. */
  entity: string | null
  fence: string | null
  method: string
  path: string
  bodySha256: string | null
  caller: string | null
  requestId: string
  idempotency: IdempotencyClaim | null
  /**
   * For `fence: lease` routes, the job whose lease the fence must belong to:
   * the fence is accepted only if it is that job's current token on an
   * unexpired lease of a running job.
   */
  leaseJob?: string | null
}

/** What an idempotent command claims: a key for a payload, and how long it may hold it. */
export interface IdempotencyClaim {
  key: string
  fingerprint: string
  /** A gateway-made secret that lets only this request complete or release the record. */
  ownerToken: string
  lockMs: number
  ttlMs: number
  /** `on_unknown_outcome: retry`: a duplicate of an unknown outcome forwards again. */
  retryUnknown: boolean
}

/** A response kept for replay: the status, the allow-listed headers and the body bytes. */
export interface StoredResponse {
  status: number
  headers: [string, string][]
  body: Uint8Array
}

/** What the store decided for a command, in one statement. */
export type Reservation =
  | { kind: 'stale'; highest: string }
  | { kind: 'lease_expired' }
  | { kind: 'proceed'; highest: string | null }
  | { kind: 'replay'; stored: StoredResponse }
  /** `retryAfterMs`: what is left of the original's lock; `ageMs`: how long ago the original was reserved. */
  | { kind: 'in_progress'; retryAfterMs: number; ageMs: number }
  | { kind: 'reused' }
  | { kind: 'outcome_unknown' }
  | { kind: 'not_replayable' }

interface ReserveRow {
  highest: string | null
  state: string | null
  owned: boolean | null
  same_payload: boolean | null
  status: number | null
  headers: string | null
  body: Uint8Array | null
  retry_after_ms: number | null
  age_ms: number | null
  lease_ok: boolean
}

/**
 * Presents the fence and reserves the key in ONE statement, `fg_reserve`
 * (migrations/0012_reserve_function.sql): the fence is decided first (a stale
 * fence touches no key), then the key is inserted, or the existing record is
 * locked and returned. A record is taken over only when it expired, or when it
 * is an unknown outcome of the same payload on a route with
 * `on_unknown_outcome: retry`; an in-flight record whose lock expired becomes
 * `outcome_unknown`. Stale fences and reused keys are audited in the same
 * statement, so a rejection costs one round trip. As in `presentFence`, only a
 * fence above the snapshot's highest writes the fence row. A duplicate of a
 * completed key whose fence equals the entity's highest (or that has no fence)
 * is a replay that moves nothing: the function answers it with a read before
 * anything that writes, so it costs no commit flush.
 */
export async function reserve(db: Db, c: Command): Promise<Reservation> {
  if (!c.idempotency && !c.leaseJob) return presentFence(db, c)
  const k = c.idempotency
  const [row] = await db.sql<ReserveRow>`
    SELECT * FROM fg_reserve(${c.tenant}, ${c.route}, ${c.entity}, ${c.fence}::bigint, ${c.method}, ${c.path},
      ${c.bodySha256}, ${c.caller}, ${c.requestId}, ${k?.key ?? null}, ${k?.fingerprint ?? null},
      ${k?.ownerToken ?? null}, ${k?.lockMs ?? null}::bigint, ${k?.ttlMs ?? null}::bigint, ${k?.retryUnknown ?? false}::boolean,
      ${c.leaseJob ?? null}::bigint)`
  return decide(row!, c)
}

/**
 * The fence alone, for commands without a key or a lease: the same decision and
 * stale audit as in `reserve`, in a statement a fraction of its size (most
 * fenced traffic takes this path, and the planner's work is per statement).
 *
 * A fence the statement's snapshot already shows as the highest (or below it) is decided
 * by that read alone: the highest never falls, so an equal fence is accepted and a lower
 * one is stale, and neither writes the fence row. Only a fence above the snapshot's
 * (or an entity's first) goes through the upsert, whose row lock re-checks it against
 * the latest committed value. A holder's repeated calls at its fence then cost a read
 * and no commit flush, where writing the row each time cost ~2.5x the PostgreSQL CPU.
 */
async function presentFence(db: Db, c: Command): Promise<Reservation> {
  const [row] = await db.sql<{ highest: string }>`
    WITH current AS (
      SELECT highest_fence FROM fg_fences WHERE tenant = ${c.tenant} AND entity = ${c.entity}
    ), decided AS (
      INSERT INTO fg_fences AS f (tenant, entity, highest_fence, updated_at, request_id)
      SELECT ${c.tenant}, ${c.entity}, ${c.fence}::bigint, now(), ${c.requestId}
      WHERE NOT EXISTS (SELECT 1 FROM current WHERE highest_fence >= ${c.fence}::bigint)
      ON CONFLICT (tenant, entity) DO UPDATE
        SET highest_fence = GREATEST(f.highest_fence, EXCLUDED.highest_fence),
            updated_at = CASE WHEN EXCLUDED.highest_fence >= f.highest_fence THEN now() ELSE f.updated_at END,
            request_id = CASE WHEN EXCLUDED.highest_fence >= f.highest_fence THEN EXCLUDED.request_id ELSE f.request_id END,
            previous_fence = f.highest_fence
      RETURNING highest_fence, previous_fence
    ), outcome AS (
      -- Exactly one row: the upsert's answer, or the snapshot's when that decided alone.
      SELECT highest_fence FROM decided
      UNION ALL
      SELECT highest_fence FROM current WHERE highest_fence >= ${c.fence}::bigint
    ), moved AS (
      -- The fence's history, by the statement that moved it (see fence-history.ts).
      INSERT INTO fg_fence_history (tenant, entity, old_fence, new_fence, source, route, caller, request_id)
      SELECT ${c.tenant}, ${c.entity}, previous_fence, highest_fence, 'command', ${c.route}, ${c.caller}, ${c.requestId}
      FROM decided WHERE previous_fence IS NULL OR highest_fence > previous_fence
      RETURNING id
    ), stale AS (
      INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, body_sha256, caller, request_id)
      SELECT ${c.tenant}, ${c.route}, ${c.entity}, 'stale_fence', ${c.fence}::bigint, highest_fence,
             ${c.method}, ${c.path}, ${c.bodySha256}, ${c.caller}, ${c.requestId}
      FROM outcome WHERE highest_fence > ${c.fence}::bigint
      RETURNING id
    )
    SELECT highest_fence::text AS highest FROM outcome`
  const highest = row!.highest
  return BigInt(highest) > BigInt(c.fence!) ? { kind: 'stale', highest } : { kind: 'proceed', highest }
}

function decide(row: ReserveRow, c: Command): Reservation {
  if (!row.lease_ok) return { kind: 'lease_expired' }
  if (row.highest !== null && BigInt(row.highest) > BigInt(c.fence!)) return { kind: 'stale', highest: row.highest }
  if (!c.idempotency || row.owned) return { kind: 'proceed', highest: row.highest }
  if (!row.same_payload) return { kind: 'reused' }
  switch (row.state) {
    case 'completed':
      return { kind: 'replay', stored: { status: row.status!, headers: JSON.parse(row.headers ?? '[]') as [string, string][], body: row.body ?? new Uint8Array(0) } }
    case 'not_replayable': return { kind: 'not_replayable' }
    case 'outcome_unknown': return { kind: 'outcome_unknown' }
    default: return { kind: 'in_progress', retryAfterMs: row.retry_after_ms ?? 0, ageMs: row.age_ms ?? 0 }
  }
}
