import { createBatcher, type Schedule } from './batch.js'
import type { Db } from './db.js'
import type { Command, Positioned, Reservation } from './commands.js'
import { readPosition, type PositionRow } from './wal.js'

interface PresentRow extends PositionRow {
  i?: number
  highest: string
}

/**
 * Presents the fences of commands without a key or a lease (most fenced traffic) to
 * `fg_present_fence` (migrations/0013, 0017), the fences of one scheduled turn in ONE statement
 * and one transaction: one round trip, one commit and one flush for all of them, where each
 * command's own statement paid a commit per raise. A command is still answered only after the
 * commit that made its decision durable, and each gets its own decision and position.
 *
 * Within a batch the fences are presented in (tenant, entity) order, keeping arrival order
 * within an entity: every batch takes its row locks in one order, so two batches raising the same
 * entities wait for each other instead of deadlocking. A batch that fails on a row's data, or
 * that PostgreSQL rolled back anyway, is presented again command by command (see batch.ts).
 *
 * @example
 * const presenter = createPresenter(db, setImmediate)
 * const { reservation } = await presenter.present(command)
 */
export function createPresenter(db: Db, schedule?: Schedule) {
  const batcher = createBatcher<Command, Positioned>({ schedule, write: (batch) => presentAll(db, batch) })
  return { present: (command: Command): Promise<Positioned> => batcher.add(command), drain: batcher.drain }
}

async function presentAll(db: Db, batch: Command[]): Promise<Positioned[]> {
  if (batch.length === 1) return [await presentOne(db, batch[0]!)]
  const order = batch.map((_, i) => i).sort((a, b) => byEntity(batch[a]!, batch[b]!) || a - b)
  const rows = order.map((i) => {
    const c = batch[i]!
    return {
      i, tenant: c.tenant, route: c.route, entity: c.entity, fence: c.fence, method: c.method, path: c.path,
      body_sha256: c.bodySha256, caller: c.caller, request_id: c.requestId, trace_id: c.traceId ?? null,
    }
  })
  // fg_present_fences (migrations/0018) decides them in this order; the position columns
  // other than each command's own LSN are the same for all and read after it returned.
  const answered = await db.sql<PresentRow>`
    SELECT d.i, d.highest::text AS highest, d.lsn AS fg_lsn, pg_walfile_name(pg_current_wal_insert_lsn()) AS fg_wal,
      extract(epoch FROM pg_postmaster_start_time())::text AS fg_boot
    FROM fg_present_fences(${JSON.stringify(rows)}::text::jsonb) AS d`
  const out = new Array<Positioned>(batch.length)
  for (const row of answered) out[row.i!] = positioned(row, batch[row.i!]!)
  return out
}

/** One command alone: the statement without the batch's JSON (src/store/commands.ts before batching). */
async function presentOne(db: Db, c: Command): Promise<Positioned> {
  // Target-list items are evaluated in order: the position is read after the function wrote.
  // The trace id by name: this call has no key to pass before it (p_key keeps its default).
  const [row] = await db.sql<PresentRow>`
    SELECT fg_present_fence(${c.tenant}, ${c.route}, ${c.entity}, ${c.fence}::bigint, ${c.method}, ${c.path},
      ${c.bodySha256}, ${c.caller}, ${c.requestId}, p_trace_id => ${c.traceId ?? null}::text)::text AS highest,
      pg_walfile_name(pg_current_wal_insert_lsn()) AS fg_wal,
      CASE WHEN pg_current_xact_id_if_assigned() IS NOT NULL THEN pg_current_wal_insert_lsn()::text END AS fg_lsn,
      extract(epoch FROM pg_postmaster_start_time())::text AS fg_boot`
  return positioned(row!, c)
}

function positioned(row: PresentRow, c: Command): Positioned {
  const highest = row.highest
  const reservation: Reservation = BigInt(highest) > BigInt(c.fence!) ? { kind: 'stale', highest } : { kind: 'proceed', highest }
  return { reservation, position: readPosition(row) }
}

/**
 * The order of fence rows every batch takes its locks in (JavaScript's string order, the same in
 * every gateway): by tenant, then entity. Keyed batches take key rows after, by byKey.
 */
export function byEntity(a: Command, b: Command): number {
  if (a.tenant !== b.tenant) return a.tenant < b.tenant ? -1 : 1
  const x = a.entity ?? ''
  const y = b.entity ?? ''
  return x === y ? 0 : x < y ? -1 : 1
}
