import type { Db } from './db.js'
import { compareLsn, forkPoint, type StoreState } from './wal.js'

/** What a change of the store's identity, timeline or start means for what it acknowledged. */
export type Verdict =
  | { kind: 'refuse'; code: 'store_identity_changed' | 'store_lost_commits'; detail: string; fields: Record<string, string | number> }
  /** A new timeline that kept every acknowledged write: served, and logged as `store_failover`. */
  | { kind: 'failover'; fields: Record<string, string | number> }
  /** Nothing lost: the same timeline, and (after a restart) the WAL at or past the last acknowledged write. */
  | { kind: 'kept' }

/**
 * Judges a store state `seen` against the one the gateway knew, given the WAL position of
 * the last write it acknowledged (`acked`, undefined when none since the last check):
 * - another system identifier is another cluster behind the address;
 * - a new timeline lost commits when its fork point is at or below `acked` (or unknown);
 * - the same timeline after a restart lost them when its WAL ends before `acked`.
 *
 * @example
 * const v = await judgeChange(db, known, seen, acked)
 * if (v.kind === 'refuse') log.error(v.code, v.fields)
 */
export async function judgeChange(db: Db, known: StoreState, seen: StoreState, acked: string | undefined): Promise<Verdict> {
  if (seen.systemId !== known.systemId) {
    return {
      kind: 'refuse', code: 'store_identity_changed', fields: { from: known.systemId, to: seen.systemId },
      detail: 'the store is another cluster than the one this gateway started on; restart the gateway once that is intended',
    }
  }
  if (seen.timeline !== known.timeline) {
    const fork = await forkPoint(db, known.timeline, seen.timeline)
    const fields = { from_timeline: known.timeline, to_timeline: seen.timeline, fork_lsn: fork ?? 'unknown' }
    if (acked && (fork === undefined || compareLsn(acked, fork) >= 0)) {
      return {
        kind: 'refuse', code: 'store_lost_commits', fields: { ...fields, acknowledged_lsn: acked },
        detail: 'the store failed over to a standby that lacks commits this gateway acknowledged; nothing is served until the gateway is restarted',
      }
    }
    return { kind: 'failover', fields }
  }
  if (seen.boot !== known.boot && acked && compareLsn(seen.insertLsn, acked) < 0) {
    return {
      kind: 'refuse', code: 'store_lost_commits', fields: { timeline: seen.timeline, acknowledged_lsn: acked, insert_lsn: seen.insertLsn },
      detail: 'the store restarted without commits this gateway acknowledged (synchronous_commit off?); nothing is served until the gateway is restarted',
    }
  }
  return { kind: 'kept' }
}
