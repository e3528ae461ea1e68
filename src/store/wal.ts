import type { Db } from './db.js'

/**
 * The PostgreSQL facts fencegate's durability checks read (src/store/durability.ts): WAL
 * positions, timelines, the cluster's identity and its replication. All are readable by a
 * role without special privileges, but for two: the standbys' states in `pg_stat_replication`
 * (rows of other roles read as NULL without `pg_monitor`) and the timeline history file
 * (`pg_read_file`, for the fork point after more than one failover).
 */

/**
 * Where a command statement left the WAL. Its statements add three columns
 * (`fg_wal`, `fg_lsn`, `fg_boot`; written out in each statement, src/store/commands.ts,
 * present.ts and src/leases/claim.ts, since a tagged template binds values, not SQL; a batch of
 * fences reads each command's `fg_lsn` after its own writes, in fg_present_fences): the WAL file name of the insert
 * position (its first 8 hex digits are the timeline), that position when the statement wrote
 * (it then holds an xid) and the server's start time. A write's commit record follows the
 * position, so a standby that has the commit has WAL beyond it.
 */
export interface WalPosition {
  timeline: number
  /** The insert position after the statement's writes, as `X/Y`; undefined when it wrote nothing. */
  lsn: string | undefined
  boot: string
}

export interface PositionRow {
  fg_wal?: string | null
  fg_lsn?: string | null
  fg_boot?: string | null
}

/** The position a command statement's row carries, or undefined on a store that returns none. */
export function readPosition(row: PositionRow | undefined): WalPosition | undefined {
  if (!row?.fg_wal || !row.fg_boot) return undefined
  return { timeline: parseInt(row.fg_wal.slice(0, 8), 16), lsn: row.fg_lsn ?? undefined, boot: row.fg_boot }
}

/** The furthest of several statements' positions (undefined when none has one). */
export function latestPosition(positions: (WalPosition | undefined)[]): WalPosition | undefined {
  return positions.reduce<WalPosition | undefined>((a, b) => (!a || (b?.lsn && a.lsn && compareLsn(b.lsn, a.lsn) > 0) ? b : a), undefined)
}

/**
 * Compares two LSNs (`X/Y`, hexadecimal, each half below 2^32): negative, zero or positive.
 * Every command compares one (src/store/durability.ts), so the halves are parsed as numbers:
 * BigInt parsing cost about 4 µs a comparison.
 */
export function compareLsn(a: string, b: string): number {
  const slashA = a.indexOf('/')
  const slashB = b.indexOf('/')
  const high = parseInt(a.slice(0, slashA), 16) - parseInt(b.slice(0, slashB), 16)
  return high !== 0 ? Math.sign(high) : Math.sign(parseInt(a.slice(slashA + 1), 16) - parseInt(b.slice(slashB + 1), 16))
}

/** One reading of the primary: what its commits wait for, and who it is. */
export interface StoreState {
  systemId: string
  timeline: number
  boot: string
  insertLsn: string
  /** synchronous_commit waits for a standby, one is named, and one streams as `sync` or `quorum` and keeps up (or replied within a second). */
  replicated: boolean
}

/**
 * How long a synchronous standby that is behind the primary's flushed WAL may go without
 * replying before it counts as gone. A standby cut off by the network still reads as
 * `streaming` until the primary's `wal_sender_timeout` (60 s by default), while commits wait
 * for it; one that keeps up replies after each flush it receives, and an idle one is not
 * behind (its status replies come only every `wal_receiver_status_interval`, 10 s).
 */
const silentStandbyMs = 1000

interface StateRow {
  synchronous_commit: string
  standby_names: string
  sync_streaming: number
  recovery: boolean
  system_id: string
  wal_file: string | null
  insert_lsn: string | null
  boot: string
}

/**
 * Reads the store's replication and identity in one statement; undefined on a node in
 * recovery (a standby is nobody's primary). `synchronous_commit` is this session's value, so
 * a role-level `ALTER ROLE ... SET synchronous_commit` counts as it does for commands.
 */
export async function readStoreState(db: Db): Promise<StoreState | undefined> {
  const [row] = await db.sql<StateRow>`
    SELECT current_setting('synchronous_commit') AS synchronous_commit,
      current_setting('synchronous_standby_names') AS standby_names,
      (SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')
        AND (flush_lsn >= pg_current_wal_flush_lsn() OR reply_time > now() - ${silentStandbyMs} * interval '1 millisecond'))::int AS sync_streaming,
      pg_is_in_recovery() AS recovery,
      (SELECT system_identifier::text FROM pg_control_system()) AS system_id,
      CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_walfile_name(pg_current_wal_insert_lsn()) END AS wal_file,
      CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_insert_lsn()::text END AS insert_lsn,
      extract(epoch FROM pg_postmaster_start_time())::text AS boot`
  if (!row || row.recovery || !row.wal_file || !row.insert_lsn) return undefined
  return {
    systemId: row.system_id,
    timeline: parseInt(row.wal_file.slice(0, 8), 16),
    boot: row.boot,
    insertLsn: row.insert_lsn,
    replicated: !['off', 'local'].includes(row.synchronous_commit) && row.standby_names.trim() !== '' && row.sync_streaming > 0,
  }
}

/**
 * Where timeline `from` ended in the history of timeline `to`: commits on `from` at or after
 * it are not on `to`. Read from `to`'s history file when the role may (`pg_read_file`);
 * otherwise, for the next timeline only, from `pg_last_wal_replay_lsn()`, which a promoted
 * standby keeps at the last record it replayed until it restarts. Undefined when neither
 * tells: the caller then assumes the worst.
 */
export async function forkPoint(db: Db, from: number, to: number): Promise<string | undefined> {
  const file = `pg_wal/${to.toString(16).toUpperCase().padStart(8, '0')}.history`
  try {
    const [row] = await db.sql<{ history: string }>`SELECT pg_read_file(${file}) AS history`
    for (const line of (row?.history ?? '').split('\n')) {
      const [parent, lsn] = line.trim().split(/\s+/)
      if (parent && lsn && Number(parent) === from) return lsn
    }
    return undefined
  } catch {
    // No privilege to read it (42501): the promoted node's replay position is the fork point.
  }
  if (to !== from + 1) return undefined
  const [row] = await db.sql<{ lsn: string | null }>`SELECT pg_last_wal_replay_lsn()::text AS lsn`
  return row?.lsn ?? undefined
}
