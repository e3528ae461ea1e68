import { createBatcher, type Schedule } from '../store/batch.js'
import type { Db } from '../store/db.js'
import type { Holder } from './types.js'

/** Who asked for a completion, for the audit row of one that is refused. */
export interface CompletionAudit {
  requestId: string
  caller: string | null
  path: string
  /** The trace of the request, for the audit row; null or absent when untraced. */
  traceId?: string | null
}

interface Completing {
  holder: Holder
  result: string
  audit: CompletionAudit
}

export interface JobCompletion {
  /** This request completed the job. */
  completed: boolean
  /** The job was already completed by this holder with this same result: a no-op success. */
  repeated: boolean
}

/**
 * Completes jobs under their live leases, the completions of one event-loop turn in ONE
 * statement (one commit), as the gateway does for idempotency records. Each completion
 * applies exactly as a statement of its own would: only under this holder's live,
 * uncancelled lease; again with the same fence and result it is a no-op success; any other
 * late or foreign completion changes nothing and is audited as `result_rejected`.
 *
 * @example
 * const completer = createJobCompleter(db, setImmediate)
 * const { completed } = await completer.complete(holder, { rows: 3 }, { requestId, caller: null, path: '/_fencegate/jobs/7/complete' })
 */
export function createJobCompleter(db: Db, schedule?: Schedule) {
  const batcher = createBatcher<Completing, JobCompletion>({
    schedule,
    // Up to createBatcher's 100 completions and 4 MiB of results per statement.
    weight: (c) => c.result.length,
    write: (batch) => completeAll(db, batch),
  })
  return {
    complete: (holder: Holder, result: unknown, audit: CompletionAudit) =>
      batcher.add({ holder, result: JSON.stringify(result ?? null), audit }),
    drain: batcher.drain,
  }
}

/** One statement for the whole batch (fg_complete_jobs, migrations/0010): the rows come as JSON, so its text never changes. */
async function completeAll(db: Db, batch: Completing[]): Promise<JobCompletion[]> {
  const rows = batch.map((c, i) => ({
    i, job_id: c.holder.jobId, tenant: c.holder.tenant, owner: c.holder.workerId, sub: c.holder.sub ?? null, fence: c.holder.fence,
    result: c.result, path: c.audit.path, caller: c.audit.caller, request_id: c.audit.requestId, trace_id: c.audit.traceId ?? null,
  }))
  const decided = await db.sql<{ i: number; completed: boolean; repeated: boolean }>`
    SELECT i, completed, repeated FROM fg_complete_jobs(${JSON.stringify(rows)}::text::jsonb) ORDER BY i`
  return decided.map(({ completed, repeated }) => ({ completed, repeated }))
}
