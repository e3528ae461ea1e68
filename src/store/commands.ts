import type { Db } from './db.js'
import { readPosition, type PositionRow, type WalPosition } from './wal.js'

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
  /** The trace of the request (32 lowercase hex digits), for the audit row of a refusal; null or absent when untraced. */
  traceId?: string | null
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

/** A decision and where it left the WAL (src/store/wal.ts), for the durability checks. */
export interface Positioned {
  reservation: Reservation
  position: WalPosition | undefined
}

export interface ReserveRow extends PositionRow {
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
 * Presents the fence and reserves the key in ONE call, `fg_reserve`
 * (migrations/0014_reserve_in_steps.sql, 0016), in one transaction: the lease is checked,
 * the fence is decided by `fg_present_fence` (a stale fence touches no key), then the
 * key is inserted, or the existing record is locked and returned. A record is taken
 * over only when it expired, or when it is an unknown outcome of the same payload on
 * a route with `on_unknown_outcome: retry`; an in-flight record whose lock expired
 * becomes `outcome_unknown`. Refused leases, stale fences and reused keys are audited
 * in the same call, so a rejection costs one round trip. A duplicate of a completed
 * key whose fence equals the entity's highest (or that has no fence) is a replay that
 * moves nothing: the function answers it with a read before anything that writes, so
 * it costs no commit flush. Commands with neither a key nor a lease take src/store/present.ts;
 * keyed commands of a turn with others, src/store/reserve-keys.ts.
 */
export async function reserve(db: Db, c: Command): Promise<Positioned> {
  const k = c.idempotency
  // The position columns come after the function has run: its writes are in them.
  const [row] = await db.sql<ReserveRow>`
    SELECT r.*, pg_walfile_name(pg_current_wal_insert_lsn()) AS fg_wal,
      CASE WHEN pg_current_xact_id_if_assigned() IS NOT NULL THEN pg_current_wal_insert_lsn()::text END AS fg_lsn,
      extract(epoch FROM pg_postmaster_start_time())::text AS fg_boot
    FROM fg_reserve(${c.tenant}, ${c.route}, ${c.entity}, ${c.fence}::bigint, ${c.method}, ${c.path},
      ${c.bodySha256}, ${c.caller}, ${c.requestId}, ${k?.key ?? null}, ${k?.fingerprint ?? null},
      ${k?.ownerToken ?? null}, ${k?.lockMs ?? null}::bigint, ${k?.ttlMs ?? null}::bigint, ${k?.retryUnknown ?? false}::boolean,
      ${c.leaseJob ?? null}::bigint, ${c.traceId ?? null}::text) r`
  return { reservation: decide(row!, c), position: readPosition(row) }
}

/** A command's decision from its row of fg_reserve (or of a batch of them, src/store/reserve-keys.ts). */
export function decide(row: ReserveRow, c: Command): Reservation {
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
