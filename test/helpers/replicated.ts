import { spawnSync } from 'node:child_process'
import { appendFileSync, chmodSync, mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { asPostgres, clusterIn, freePort, run, startCluster, type Cluster } from './cluster.js'

/**
 * A primary and a streaming hot standby made the way operators make them (`pg_basebackup -R
 * -C -S`), on free loopback ports, for failover tests. `sync` puts the standby in
 * `synchronous_standby_names` (`FIRST 1 (n2)`); without it replication is asynchronous.
 */
export interface ReplicatedPair {
  primary: Cluster
  standby: Cluster
  /** The libpq multi-host URL naming both, standby first: the order must not matter. */
  url: string
  /** Runs one statement on `node` as the superuser (a short-lived connection of its own). */
  query<T>(node: Cluster, text: string): Promise<T[]>
  /** Resolves when `node`'s standby streams from it (in `pg_stat_replication`), bounded by `tries` × 50 ms. */
  streaming(node: Cluster, tries?: number): Promise<void>
  /** Stops the standby's WAL receiver (it stays up, read-only, and falls behind); resolves when the primary sees no standby. */
  cut(): Promise<void>
  /**
   * A partition, as the primary sees one: every process of `node` stopped (SIGSTOP) with its
   * connections left open, so the primary's walsender still reads as streaming until
   * `wal_sender_timeout` (60 s). `on` false resumes them (SIGCONT).
   */
  freeze(node: Cluster, on: boolean): void
  /** `pg_ctl promote -w` on the standby. */
  promote(): void
  /** Turns `old`, a stopped former primary, into a standby of `primary` with `pg_rewind`, and starts it. */
  rejoin(old: Cluster, primary: Cluster): Promise<void>
  destroy(): void
}

export async function startPair(bin: string, options: { sync: boolean }): Promise<ReplicatedPair> {
  const settings = ['wal_level=replica', 'max_wal_senders=10', 'max_replication_slots=10', 'hot_standby=on', 'wal_log_hints=on', 'wal_keep_size=256MB']
  // Data checksums: pg_rewind needs them (or wal_log_hints, which its own crash recovery run lacks).
  const primary = await startCluster(bin, { settings, checksums: true })
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-standby-'))
  chmodSync(dir, 0o777)
  run(join(bin, 'pg_basebackup'), ['-h', '127.0.0.1', '-p', String(primary.port), '-U', 'postgres', '-D', join(dir, 'data'), '-R', '-C', '-S', 'n2', '-X', 'stream'])
  const standbyPort = await freePort()
  // Named n2 for synchronous_standby_names; in postgresql.auto.conf (last wins), so ALTER SYSTEM can cut it.
  appendFileSync(join(dir, 'data', 'postgresql.auto.conf'), `primary_conninfo = 'host=127.0.0.1 port=${primary.port} user=postgres application_name=n2'\n`)
  const standby = clusterIn(bin, dir, standbyPort, settings)
  const query = async <T>(node: Cluster, text: string): Promise<T[]> => {
    const sql = postgres(node.url, { max: 1, onnotice: () => {}, fetch_types: false, connect_timeout: 2, connection: { application_name: 'fault-test' } })
    try {
      return (await sql.unsafe(text)) as unknown as T[]
    } finally {
      await sql.end({ timeout: 1 })
    }
  }
  const pair: ReplicatedPair = {
    primary,
    standby,
    url: `postgres://postgres@127.0.0.1:${standbyPort},127.0.0.1:${primary.port}/postgres`,
    query,
    async streaming(node, tries = 200) {
      for (let i = 0; ; i++) {
        const rows = await query<{ n: number }>(node, `SELECT count(*)::int AS n FROM pg_stat_replication WHERE state = 'streaming'`)
        if (rows[0]!.n > 0) return
        if (i >= tries) throw new Error(`the standby never streamed: ${readFileSync(node === primary ? standby.log : primary.log, 'utf8').split('\n').slice(-8).join('\n')}`)
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
    },
    async cut() {
      await query(standby, `ALTER SYSTEM SET primary_conninfo = ''`)
      await query(standby, 'SELECT pg_reload_conf()')
      for (let i = 0; ; i++) {
        const rows = await query<{ n: number }>(primary, 'SELECT count(*)::int AS n FROM pg_stat_replication')
        if (rows[0]!.n === 0) return
        if (i >= 200) throw new Error('the standby kept streaming')
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
    },
    freeze(node, on) {
      const postmaster = readFileSync(join(node.dir, 'data', 'postmaster.pid'), 'utf8').split('\n')[0]!.trim()
      const signal = on ? '-STOP' : '-CONT'
      // The children first when stopping (none may act on a stopped parent), the parent first when resuming.
      const children = () => spawnSync('pkill', [signal, '-P', postmaster])
      if (on) children()
      spawnSync('kill', [signal, postmaster])
      if (!on) children()
    },
    promote: () => run(join(bin, 'pg_ctl'), ['-D', join(standby.dir, 'data'), '-w', '-t', '30', 'promote']),
    async rejoin(old, to) {
      // A promoted standby writes its new timeline into pg_control at its first checkpoint;
      // before it, pg_rewind sees one timeline and says no rewind is required.
      await query(to, 'CHECKPOINT')
      // pg_rewind copies the source's settings, primary_slot_name (n2) among them: the slot must exist there.
      await query(to, `SELECT pg_create_physical_replication_slot('n2') WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = 'n2')`)
      // pg_rewind's complaints are worth reading when it refuses: its output goes into the error.
      const [cmd, argv] = asPostgres(join(bin, 'pg_rewind'), ['-D', join(old.dir, 'data'), `--source-server=host=127.0.0.1 port=${to.port} user=postgres dbname=postgres`, '-R'])
      const rewound = spawnSync(cmd, argv, { encoding: 'utf8' })
      if (rewound.status !== 0) throw new Error(`pg_rewind failed: ${rewound.stderr}`)
      old.start()
    },
    destroy() {
      standby.destroy()
      primary.destroy()
    },
  }
  await pair.streaming(primary)
  if (options.sync) {
    await query(primary, `ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (n2)'`)
    await query(primary, 'SELECT pg_reload_conf()')
  }
  return pair
}
