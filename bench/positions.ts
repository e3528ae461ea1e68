// `npm run bench -- positions`: what knowing the acknowledged WAL position costs
// (docs/operations.md#failover). Every command statement carries three columns more
// (`fg_wal`, `fg_lsn`, `fg_boot`: src/store/wal.ts) and the gateway compares them
// (`observe`, src/store/durability.ts). On a throwaway cluster with pg_stat_statements, this
// runs the store's own fence statement N times (a fence on 1,000 entities, raised every 2,000
// commands), alternating with the same function call without the three columns, and reports
// PostgreSQL's mean execution time of each, and the gateway-side cost of `observe` per command.
import postgres from 'postgres'
import { migrate } from '../src/store/migrate.js'
import { loadMigrations } from '../src/store/migrations-fs.js'
import { connectPostgres } from '../src/store/postgres.js'
import { createStore } from '../src/store/store.js'
import { watchDurability } from '../src/store/durability.js'
import { readPosition, type PositionRow } from '../src/store/wal.js'
import { silentLogger } from '../src/observe/log.js'
import { postgresBinaries, startCluster } from '../test/helpers/cluster.js'

const commands = 20_000

export async function runPositionsBench(): Promise<number> {
  const bin = postgresBinaries()
  if (!bin) {
    console.log('positions: skipped, no PostgreSQL server binaries (initdb, pg_ctl) found')
    return 0
  }
  const cluster = await startCluster(bin, { settings: ['shared_preload_libraries=pg_stat_statements', 'pg_stat_statements.track=all'] })
  const admin = postgres(cluster.url, { max: 1, onnotice: () => {} })
  const db = connectPostgres(cluster.url, { max: 4 })
  try {
    await admin`CREATE EXTENSION pg_stat_statements`
    await migrate(db, loadMigrations())
    const durability = await watchDurability(db, { log: silentLogger, requireReplicated: false, everyMs: 60_000 })
    const store = createStore(db, { schedule: setImmediate, durability })
    await admin`SELECT pg_stat_statements_reset()`
    // Alternating, on two sets of entities with the same fences: the store's statement, and
    // the same function call without the position columns.
    for (let i = 0; i < commands; i++) {
      const fence = String(1 + Math.floor(i / 2000))
      await store.reserve({ tenant: 't', route: 'r', entity: `a:${i % 1000}`, fence, method: 'POST', path: '/p', bodySha256: null, caller: null, requestId: `r${i}`, idempotency: null, leaseJob: null })
      await db.sql`SELECT fg_present_fence(${'t'}, ${'r'}, ${`b:${i % 1000}`}, ${fence}::bigint, ${'POST'}, ${'/p'}, ${null}, ${null}, ${`r${i}`}, p_trace_id => ${null}::text)::text AS highest`
    }
    const stats = await admin<{ query: string; calls: string; mean_us: number }[]>`
      SELECT query, calls::text, (mean_exec_time * 1000)::float8 AS mean_us FROM pg_stat_statements
      WHERE calls >= ${commands} AND query LIKE '%fg_present_fence%' AND query NOT ILIKE '%pg_stat_statements%'`
    const reserve = stats.find((s) => s.query.includes('fg_wal'))
    const bare = stats.find((s) => !s.query.includes('fg_wal'))
    // The gateway's side: observe() on positions of the server's own timeline and start, as every command after the first.
    const [row] = await db.sql<PositionRow>`SELECT pg_walfile_name(pg_current_wal_insert_lsn()) AS fg_wal, pg_current_wal_insert_lsn()::text AS fg_lsn,
      extract(epoch FROM pg_postmaster_start_time())::text AS fg_boot`
    const position = readPosition(row)!
    const base = Number.parseInt(position.lsn!.split('/')[1]!, 16)
    const started = performance.now()
    for (let i = 0; i < commands; i++) await durability.observe({ ...position, lsn: `${position.lsn!.split('/')[0]}/${(base + i).toString(16).toUpperCase()}` })
    const observeUs = ((performance.now() - started) * 1000) / commands
    durability.close()
    console.log(`positions (${commands} reservations, PostgreSQL 15, pg_stat_statements, mean execution per call):`)
    console.log(`  the fence statement with its position columns: ${reserve ? reserve.mean_us.toFixed(1) : '?'} µs`)
    console.log(`  the same without them: ${bare ? bare.mean_us.toFixed(1) : '?'} µs${reserve && bare ? ` (the columns: ${(((reserve.mean_us - bare.mean_us) / reserve.mean_us) * 100).toFixed(1)}% of it)` : ''}`)
    console.log(`  observe() in the gateway: ${observeUs.toFixed(2)} µs per command (wall clock, this process)`)
    return 0
  } finally {
    await db.close()
    await admin.end()
    cluster.destroy()
  }
}
