import { concatBytes } from '../http/body.js'
import { createBatcher, type Schedule } from './batch.js'
import type { Db } from './db.js'
import type { StoredResponse } from './commands.js'
import { localDurability, type Durability } from './durability.js'
import type { Held } from './keys.js'
import { byKey } from './reserve-keys.js'
import { latestPosition, readPosition, type PositionRow, type WalPosition } from './wal.js'

export type { Schedule } from './batch.js'

/** What a finished request stores under its key. */
export interface Completion {
  replayable: boolean
  response: StoredResponse
  ttlMs: number
}

interface Pending {
  held: Held
  completion: Completion
}

/**
 * Stores finished requests' responses for replay (`completed`), or records that
 * one was too large to keep (`not_replayable`). Under load many requests finish
 * in the same event-loop turn; their completions are written by ONE statement
 * (`createBatcher`: one commit, one socket write), which is what lets a new key cost the
 * gateway and the database less than two full round trips. Each completion
 * applies only while its request still owns the in-flight record, exactly as
 * a statement of its own would, and resolves to false when it no longer does.
 * A row the database refuses fails only its own completion; a lost store fails the
 * batch. `drain()` writes what is pending and waits for every write under way: the
 * store calls it before it closes, so no completion is left unwritten.
 *
 * The statement's WAL position goes to the store's `durability` as a reservation's does:
 * a stored answer that a failover loses would leave its key in flight on the new primary,
 * where a retry gets `outcome_unknown` instead of its replay (or, with `on_unknown_outcome:
 * retry`, executes again), so losing it must be seen (`store_lost_commits`).
 *
 * @example
 * const completer = createCompleter(db, setImmediate)
 * const applied = await completer.complete(held, { replayable: true, response, ttlMs: 86_400_000 })
 * await completer.drain() // before the Db closes
 */
export function createCompleter(db: Db, schedule?: Schedule, durability: Durability = localDurability) {
  const batcher = createBatcher<Pending, boolean>({
    schedule,
    // Up to createBatcher's 100 completions and 4 MiB of bodies per statement.
    weight: ({ completion: c }) => (c.replayable ? c.response.body.byteLength : 0),
    write: async (batch) => {
      const { applied, position } = await completeAll(db, batch)
      await durability.observe(position)
      return batch.map((_, i) => applied.has(i))
    },
  })
  return {
    complete: (held: Held, completion: Completion): Promise<boolean> => batcher.add({ held, completion }),
    drain: batcher.drain,
  }
}

/**
 * One statement for the whole batch (fg_complete, migrations/0007): the rows
 * come as JSON, the bodies as one byte string cut by offset, so the statement
 * text is the same for every batch size. Returns the indexes that applied and where the
 * statement left the WAL.
 */
async function completeAll(db: Db, batch: Pending[]): Promise<{ applied: Set<number>; position: WalPosition | undefined }> {
  const bodies: Uint8Array[] = []
  let offset = 0
  const rows = batch.map(({ held, completion: c }, i) => {
    const body = c.replayable ? c.response.body : new Uint8Array(0)
    bodies.push(body)
    const row = {
      i, tenant: held.tenant, key: held.key, owner_token: held.ownerToken, replayable: c.replayable,
      status: c.response.status, headers: c.response.headers, offset, length: body.byteLength, ttl_ms: c.ttlMs,
    }
    offset += body.byteLength
    return row
  })
  const blob = concatBytes(bodies, offset)
  // Key rows locked in (tenant, key) order, the order every batch of keys takes them in
  // (migrations/0021): a batch of completions and one of reservations cannot deadlock.
  rows.sort((a, b) => byKey(a, b) || a.i - b.i)
  // The position columns are read after fg_complete's writes (its rows are materialized first).
  const applied = await db.sql<{ i: number } & PositionRow>`
    SELECT i, pg_walfile_name(pg_current_wal_insert_lsn()) AS fg_wal, pg_current_wal_insert_lsn()::text AS fg_lsn,
      extract(epoch FROM pg_postmaster_start_time())::text AS fg_boot
    FROM fg_complete(${JSON.stringify(rows)}::text::jsonb, ${blob}::bytea) AS i`
  return { applied: new Set(applied.map((r) => r.i)), position: latestPosition(applied.map(readPosition)) }
}
