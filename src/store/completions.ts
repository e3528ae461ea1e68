import { concatBytes } from '../http/body.js'
import { StoreError, type Db } from './db.js'
import type { StoredResponse } from './commands.js'
import type { Held } from './keys.js'

/** What a finished request stores under its key. */
export interface Completion {
  replayable: boolean
  response: StoredResponse
  ttlMs: number
}

/**
 * When a batch of completions is written: called with the flush once per batch,
 * when its first completion arrives. Node passes `setImmediate`, so every
 * completion of one event-loop turn shares one statement; the default
 * (`queueMicrotask`) batches only completions issued in one synchronous stretch.
 */
export type Schedule = (flush: () => void) => void

interface Pending {
  held: Held
  completion: Completion
  resolve: (applied: boolean) => void
  reject: (err: unknown) => void
}

// One batch stays small enough to be one ordinary statement; a larger one is split.
const maxBatch = 100
const maxBatchBodyBytes = 4 * 1024 * 1024

/**
 * Stores finished requests' responses for replay (`completed`), or records that
 * one was too large to keep (`not_replayable`). Under load many requests finish
 * in the same event-loop turn; their completions are written by ONE statement
 * (one commit, one socket write), which is what lets a new key cost the
 * gateway and the database less than two full round trips. Each completion
 * applies only while its request still owns the in-flight record, exactly as
 * a statement of its own would, and resolves to false when it no longer does.
 * If a batch of several fails on a row's data (SQLSTATE class 22 or 23), each
 * of its completions is retried alone, so one bad row cannot fail the requests
 * it happened to share a turn with; any other failure (a connection lost, the
 * store down) fails the whole batch at once, as it would each statement.
 * `drain()` writes what is pending and waits for every write under way: the
 * store calls it before it closes, so no completion is left unwritten.
 *
 * @example
 * const completer = createCompleter(db, setImmediate)
 * const applied = await completer.complete(held, { replayable: true, response, ttlMs: 86_400_000 })
 * await completer.drain() // before the Db closes
 */
export function createCompleter(db: Db, schedule: Schedule = queueMicrotask) {
  let batch: Pending[] = []
  let bodyBytes = 0
  const writing = new Set<Promise<void>>()

  const flush = () => {
    const taken = batch
    batch = []
    bodyBytes = 0
    if (taken.length === 0) return
    const written = write(db, taken)
    writing.add(written)
    void written.finally(() => writing.delete(written))
  }

  function complete(held: Held, completion: Completion): Promise<boolean> {
    return new Promise<boolean>((resolve, reject) => {
      const size = completion.replayable ? completion.response.body.byteLength : 0
      if (batch.length > 0 && (batch.length >= maxBatch || bodyBytes + size > maxBatchBodyBytes)) flush()
      if (batch.length === 0) schedule(flush)
      batch.push({ held, completion, resolve, reject })
      bodyBytes += size
    })
  }

  async function drain(): Promise<void> {
    flush()
    await Promise.all(writing)
  }

  return { complete, drain }
}

async function write(db: Db, batch: Pending[]): Promise<void> {
  try {
    const applied = await completeAll(db, batch)
    batch.forEach((p, i) => p.resolve(applied.has(i)))
  } catch (err) {
    if (batch.length === 1 || !rowsFault(err)) return batch.forEach((p) => p.reject(err))
    await Promise.all(batch.map((p) => write(db, [p])))
  }
}

/** A failure caused by a row's values (data exception, integrity violation), not by the store. */
function rowsFault(err: unknown): boolean {
  const code = err instanceof StoreError ? err.sqlstate : undefined
  return code !== undefined && (code.startsWith('22') || code.startsWith('23'))
}

/**
 * One statement for the whole batch (fg_complete, migrations/0007): the rows
 * come as JSON, the bodies as one byte string cut by offset, so the statement
 * text is the same for every batch size. Returns the indexes that applied.
 */
async function completeAll(db: Db, batch: Pending[]): Promise<Set<number>> {
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
  const applied = await db.sql<{ i: number }>`
    SELECT i FROM fg_complete(${JSON.stringify(rows)}::text::jsonb, ${blob}::bytea) AS i`
  return new Set(applied.map((r) => r.i))
}
