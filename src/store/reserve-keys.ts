import { createBatcher, type Schedule } from './batch.js'
import type { Db } from './db.js'
import { decide, reserve, type Command, type Positioned, type ReserveRow } from './commands.js'
import { byEntity } from './present.js'
import { readPosition } from './wal.js'

interface KeysRow extends ReserveRow {
  i?: number
}

/**
 * Reserves the keys of keyed commands without a lease (what a payment SDK sends with every POST),
 * the commands of one scheduled turn in ONE statement and one transaction, `fg_reserve_keys`
 * (migrations/0021): one round trip, one commit and one flush for all of them, where each paid
 * its own. Each command is decided as `fg_reserve` would decide it alone, in arrival order: a
 * second command of a key in the turn sees the first's reservation. It is answered only after
 * the commit, with its own decision and position. A batch of one keeps `fg_reserve`.
 *
 * The batch presents all its fences first, in (tenant, entity) order, then takes all its keys,
 * in (tenant, key) order, arrival order within each: the lock order that keeps two gateways'
 * batches from deadlocking (the migration says why). A batch that fails on a row's data, or that
 * PostgreSQL rolled back, is presented again command by command in arrival order (batch.ts).
 *
 * @example
 * const keys = createKeyReserver(db, setImmediate)
 * const { reservation } = await keys.reserve(command)
 */
export function createKeyReserver(db: Db, schedule?: Schedule) {
  const batcher = createBatcher<Command, Positioned>({ schedule, write: (batch) => reserveAll(db, batch) })
  return { reserve: (command: Command): Promise<Positioned> => batcher.add(command), drain: batcher.drain }
}

async function reserveAll(db: Db, batch: Command[]): Promise<Positioned[]> {
  if (batch.length === 1) return [await reserve(db, batch[0]!)]
  const fo = ranks(batch, byEntity)
  const ko = ranks(batch, (a, b) => byKey({ tenant: a.tenant, key: a.idempotency!.key }, { tenant: b.tenant, key: b.idempotency!.key }))
  const rows = batch.map((c, i) => {
    const k = c.idempotency!
    return {
      i, fo: fo[i], ko: ko[i], tenant: c.tenant, route: c.route, entity: c.entity, fence: c.fence, method: c.method,
      path: c.path, body_sha256: c.bodySha256, caller: c.caller, request_id: c.requestId, key: k.key,
      fingerprint: k.fingerprint, owner_token: k.ownerToken, lock_ms: k.lockMs, ttl_ms: k.ttlMs,
      retry_unknown: k.retryUnknown, trace_id: c.traceId ?? null,
    }
  })
  // The position columns other than each command's own LSN are the same for all, read after it returned.
  const answered = await db.sql<KeysRow>`
    SELECT d.i, true AS lease_ok, d.highest, d.state, d.owned, d.same_payload, d.status, d.headers, d.body,
      d.retry_after_ms, d.age_ms, d.lsn AS fg_lsn, pg_walfile_name(pg_current_wal_insert_lsn()) AS fg_wal,
      extract(epoch FROM pg_postmaster_start_time())::text AS fg_boot
    FROM fg_reserve_keys(${JSON.stringify(rows)}::text::jsonb) AS d`
  const out = new Array<Positioned>(batch.length)
  for (const row of answered) out[row.i!] = { reservation: decide(row, batch[row.i!]!), position: readPosition(row) }
  return out
}

/** Each command's place when sorted by `order`, arrival order among equals. */
function ranks(batch: Command[], order: (a: Command, b: Command) => number): number[] {
  const sorted = batch.map((_, i) => i).sort((a, b) => order(batch[a]!, batch[b]!) || a - b)
  const rank = new Array<number>(batch.length)
  sorted.forEach((i, r) => (rank[i] = r))
  return rank
}

/** The order of key rows (after every fence row): by tenant, then key, as JavaScript compares strings. */
export function byKey(a: { tenant: string; key: string }, b: { tenant: string; key: string }): number {
  if (a.tenant !== b.tenant) return a.tenant < b.tenant ? -1 : 1
  return a.key === b.key ? 0 : a.key < b.key ? -1 : 1
}
