import { rolledBack, StoreError } from './db.js'

/**
 * When a batch is written: called with the flush once per batch, when its first item
 * arrives. Node passes `setImmediate`, so every item of one event-loop turn shares one
 * statement; the default (`queueMicrotask`) batches only items added in one synchronous stretch.
 */
export type Schedule = (flush: () => void) => void

export interface BatchOptions<I, O> {
  schedule?: Schedule
  /** Items per statement (default 100); a fuller batch is written at once and a new one started. */
  maxItems?: number
  /** An item's share of `maxWeight` (e.g. its body's bytes); a batch past it is split. */
  weight?: (item: I) => number
  /** Default 4 MiB. */
  maxWeight?: number
  /** Writes a batch in one statement; resolves to each item's outcome, in order. */
  write: (items: I[]) => Promise<O[]>
}

/**
 * Gathers the writes of one event-loop turn into one statement: one commit and one socket
 * write instead of one each. Each item's promise settles with its own outcome. If a batch of
 * several fails on a row's data (SQLSTATE class 22 or 23), each item is written again alone,
 * in the order they were added, so one bad row cannot fail the items it happened to share a turn with. A batch PostgreSQL
 * rolled back to break a deadlock or a serialization conflict (class 40) is also written
 * again item by item: nothing of it was applied, and a transaction of one row waits for
 * no other row while it holds one. (The lease bench once saw a batch of job completions
 * and a claim deadlock at 100,000 queued, each waiting on the other's transaction.) Any other failure (a connection lost, the store down) fails the whole
 * batch at once, as it would each statement. `drain()` writes what is pending and waits for every write under way.
 *
 * @example
 * const batcher = createBatcher({ schedule: setImmediate, write: (rows) => insertAll(db, rows) })
 * const outcome = await batcher.add(row)
 */
export function createBatcher<I, O>(o: BatchOptions<I, O>) {
  const schedule = o.schedule ?? queueMicrotask
  // A batch stays small enough to be one ordinary statement; a larger one is split.
  const maxItems = o.maxItems ?? 100
  const maxWeight = o.maxWeight ?? 4 * 1024 * 1024
  let batch: { item: I; resolve: (out: O) => void; reject: (err: unknown) => void }[] = []
  let weight = 0
  const writing = new Set<Promise<void>>()

  const flush = () => {
    const taken = batch
    batch = []
    weight = 0
    if (taken.length === 0) return
    const written = writeAll(o.write, taken)
    writing.add(written)
    void written.finally(() => writing.delete(written))
  }

  function add(item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      const w = o.weight?.(item) ?? 0
      const full = batch.length >= maxItems || weight + w > maxWeight
      if (batch.length > 0 && full) flush()
      if (batch.length === 0) schedule(flush)
      batch.push({ item, resolve, reject })
      weight += w
    })
  }

  async function drain(): Promise<void> {
    flush()
    await Promise.all(writing)
  }

  return { add, drain }
}

async function writeAll<I, O>(write: (items: I[]) => Promise<O[]>, batch: { item: I; resolve: (out: O) => void; reject: (err: unknown) => void }[]): Promise<void> {
  try {
    const outcomes = await write(batch.map((p) => p.item))
    batch.forEach((p, i) => p.resolve(outcomes[i]!))
  } catch (err) {
    if (batch.length === 1 || !(rowsFault(err) || rolledBack(err))) return batch.forEach((p) => p.reject(err))
    // One after the other, in the batch's order: items that depend on each other (two fences
    // of one entity) are decided in the order they were added, as in the batch.
    for (const p of batch) await writeAll(write, [p])
  }
}

/** A failure caused by a row's values (data exception, integrity violation), not by the store. */
function rowsFault(err: unknown): boolean {
  const code = err instanceof StoreError ? err.sqlstate : undefined
  return code !== undefined && (code.startsWith('22') || code.startsWith('23'))
}
