import { Agent, request } from 'undici'
import { afterEach, describe, expect, it } from 'vitest'
import type { Logger } from '../src/observe/log.js'
import { openDb, startGateway, type RunningGateway } from '../src/runtime/node/gateway.js'
import { postgresBinaries, startCluster, type Cluster } from './helpers/cluster.js'
import { post, route, testConfig } from './helpers/gateway.js'
import { startPair, type ReplicatedPair } from './helpers/replicated.js'
import { runCli, startGatewayProcess, writeConfig, type GatewayProcess } from './helpers/process.js'
import { gate, startKeyCountingUpstream } from './helpers/upstream.js'

/**
 * A primary that fails over, on real clusters: a primary and a streaming hot standby made by
 * `pg_basebackup -R -C -S`, killed with `pg_ctl stop -m immediate`, promoted with
 * `pg_ctl promote`, rejoined with `pg_rewind`. One gateway process (in this test's process)
 * carries on through each, with the libpq multi-host URL listing the standby first; the
 * recording upstream is the oracle of what was executed.
 *
 * No bound on time is asserted: a scenario waits (in bounded polls) for what must happen,
 * and prints how long it took.
 */
const bin = postgresBinaries()

interface LogLine {
  level: string
  event: string
  fields: Record<string, unknown>
}

function recordingLog(lines: LogLine[]): Logger {
  const at = (level: string) => (event: string, fields: Record<string, unknown> = {}) => void lines.push({ level, event, fields })
  return { debug: () => {}, info: at('info'), warn: at('warn'), error: at('error') }
}

/** One fenced command on `dispatcher` (a fresh connection when none is given); its status and problem code. */
async function capture(base: string, entity: string, fence: number, dispatcher?: Agent): Promise<{ status: number; code: string }> {
  const fresh = dispatcher ?? new Agent({ pipelining: 0 })
  try {
    const res = await request(`${base}/payments/${entity}/capture`, { method: 'POST', dispatcher: fresh, headers: { 'content-type': 'application/json', 'x-execution-fence': String(fence) }, body: '{}' })
    const body = (await res.body.json().catch(() => undefined)) as { code?: string } | undefined
    return { status: res.statusCode, code: res.statusCode === 200 ? '200' : String(body?.code) }
  } finally {
    if (!dispatcher) await fresh.close()
  }
}

/** Commands with rising fences on `entities`, each keyed by entity and fence, until stopped. */
function load(gw: RunningGateway, entities: string[]) {
  const acked = new Map<string, number>()
  const keys = new Map<string, { entity: string; fence: number }>()
  const answers = new Map<string, number>()
  let stopping = false
  let after: number | undefined
  const servedAfter = new Map<string, number>()
  const loops = entities.map(async (entity) => {
    for (let fence = 1; !stopping; fence++) {
      const key = `${entity}-${fence}`
      const res = await post(`${gw.dataUrl}/payments/${entity}/capture`, String(fence), { headers: { 'idempotency-key': key } })
      const answer = res.status === 200 ? '200' : `${res.status}:${res.json?.code}`
      answers.set(answer, (answers.get(answer) ?? 0) + 1)
      if (res.status === 200) {
        acked.set(entity, fence)
        keys.set(key, { entity, fence })
        if (after !== undefined) servedAfter.set(entity, (servedAfter.get(entity) ?? 0) + 1)
      } else {
        fence-- // the same fence and key again: a retry
        await new Promise((resolve) => setTimeout(resolve, 20))
      }
    }
  })
  return {
    acked,
    keys,
    answers,
    /** From now on, count what is served. */
    mark: () => void (after = performance.now()),
    servedAfter,
    /** Resolves when every entity has `n` more acknowledged commands since `mark` (polls, bounded). */
    async served(n: number, tries = 600) {
      for (let i = 0; entities.some((e) => (servedAfter.get(e) ?? 0) < n); i++) {
        if (i >= tries) throw new Error(`not served again: ${JSON.stringify([...answers])}`)
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
    },
    async stop() {
      stopping = true
      await Promise.all(loops)
    },
  }
}

async function until(what: string, check: () => Promise<boolean>, tries = 400): Promise<void> {
  for (let i = 0; !(await check()); i++) {
    if (i >= tries) throw new Error(`never: ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

describe.skipIf(!bin)('a store that fails over', () => {
  let pair: ReplicatedPair | undefined
  let clusters: Cluster[] = []
  let gateways: RunningGateway[] = []
  let processes: GatewayProcess[] = []
  // Started with the first gateway; every test after the first reuses it.
  let upstream: Awaited<ReturnType<typeof startKeyCountingUpstream>>
  const executions = () => upstream.executions

  const start = async (url: string, lines: LogLine[], store: Record<string, unknown> = {}) => {
    upstream ??= await startKeyCountingUpstream()
    const config = testConfig([route(upstream.url, { idempotency: 'optional', timeout_ms: 2000, idempotency_lock: '3s' })], {
      server: { port: 0, admin_port: 0 }, store: { connect_timeout: '1s', ...store }, job_types: [{ name: 'report', lease: '45s' }],
    })
    const gw = await startGateway({ config, databaseUrl: url, log: recordingLog(lines) })
    gateways.push(gw)
    return gw
  }
  const health = async (gw: RunningGateway) => {
    const res = await fetch(`${gw.adminUrl}/health`)
    return { http: res.status, ...(await res.json() as { durability: string; refusing?: string }) }
  }

  afterEach(async () => {
    await Promise.all(gateways.map((g) => g.close(1000)))
    gateways = []
    await Promise.all(processes.map((p) => p.stop()))
    processes = []
    pair?.destroy()
    pair = undefined
    for (const c of clusters) c.destroy()
    clusters = []
    upstream?.executions.clear()
  })

  it('synchronous replication: a kill-and-promote loses no acknowledged fence, executes no key twice, and the same gateway serves on the new primary', async () => {
    pair = await startPair(bin!, { sync: true })
    const lines: LogLine[] = []
    // The standby is listed first: the gateway still writes only to the primary.
    const gw = await start(pair.url, lines)
    expect(await health(gw)).toMatchObject({ http: 200, durability: 'replicated' })
    const run = load(gw, ['a', 'b', 'c', 'd'])
    await until('commands acknowledged', async () => [...run.acked.values()].length === 4 && Math.min(...run.acked.values()) >= 5)

    pair.primary.stop('immediate')
    pair.promote()
    const promoted = performance.now()
    run.mark()
    await run.served(3)
    console.log(`served on the promoted standby ${Math.round(performance.now() - promoted)} ms after pg_ctl promote returned; answers ${JSON.stringify([...run.answers])}`)
    await run.stop()

    // Every acknowledged fence survived: one below it is refused.
    for (const [entity, fence] of run.acked) {
      const stale = await post(`${gw.dataUrl}/payments/${entity}/capture`, String(fence - 1))
      expect(stale.status, `${entity} at ${fence - 1}`).toBe(409)
      expect(stale.json.code).toBe('stale_fence')
    }
    // Every acknowledged key is replayed, never executed again.
    for (const [key, { entity, fence }] of run.keys) {
      const again = await post(`${gw.dataUrl}/payments/${entity}/capture`, String(fence), { headers: { 'idempotency-key': key } })
      if (fence === run.acked.get(entity)) expect(again.status, key).toBe(200)
      expect(executions().get(key), key).toBe(1)
    }
    expect([...run.answers.keys()].every((a) => ['200', '503:store_unavailable', '409:request_in_progress', '502:outcome_unknown'].includes(a)), JSON.stringify([...run.answers])).toBe(true)
    expect(lines.find((l) => l.event === 'store_failover')?.fields).toMatchObject({ from_timeline: 1, to_timeline: 2 })
    expect(lines.some((l) => l.event === 'store_lost_commits')).toBe(false)
    // The promoted standby has no standby of its own.
    await until('durability reads local', async () => (await health(gw)).durability === 'local')

    // The old primary rejoins as a standby of the new one (pg_rewind) and is never written:
    // the same gateway and a new one, with it listed, serve on the new primary.
    await pair.rejoin(pair.primary, pair.standby)
    await pair.streaming(pair.standby)
    const second = await start(`postgres://postgres@127.0.0.1:${pair.primary.port},127.0.0.1:${pair.standby.port}/postgres`, [])
    for (const target of [gw, second]) {
      const next = await post(`${target.dataUrl}/payments/a/capture`, String(run.acked.get('a')! + (target === gw ? 1 : 2)))
      expect(next.status).toBe(200)
    }
    const onOld = await pair.query<{ recovery: boolean }>(pair.primary, 'SELECT pg_is_in_recovery() AS recovery')
    expect(onOld[0]!.recovery).toBe(true)
  })

  it('target_session_attrs=primary with the standby listed first: the gateway writes to the primary, and after a promotion to the promoted standby', async () => {
    pair = await startPair(bin!, { sync: false })
    const gw = await start(`postgres://postgres@127.0.0.1:${pair.standby.port},127.0.0.1:${pair.primary.port}/postgres?target_session_attrs=primary`, [])
    expect((await post(`${gw.dataUrl}/payments/a/capture`, '1')).status).toBe(200)
    const onPrimary = await pair.query<{ highest: string }>(pair.primary, `SELECT highest_fence::text AS highest FROM fg_fences WHERE entity = 'invoice:a'`)
    expect(onPrimary[0]!.highest).toBe('1')
    await pair.streaming(pair.primary)
    // A clean shutdown: the primary sends the standby every commit before it stops.
    pair.primary.stop('fast')
    pair.promote()
    await until('served on the promoted standby', async () => (await post(`${gw.dataUrl}/payments/a/capture`, '2')).status === 200)
    const onPromoted = await pair.query<{ highest: string }>(pair.standby, `SELECT highest_fence::text AS highest FROM fg_fences WHERE entity = 'invoice:a'`)
    expect(onPromoted[0]!.highest).toBe('2')
  })

  it('a gateway pointed at the standby alone (or with target_session_attrs=any, the standby first) stops at start saying the node is read-only', async () => {
    pair = await startPair(bin!, { sync: false })
    for (const url of [`postgres://postgres@127.0.0.1:${pair.standby.port}/postgres`,
      `postgres://postgres@127.0.0.1:${pair.standby.port},127.0.0.1:${pair.primary.port}/postgres?target_session_attrs=any`]) {
      const config = writeConfig({ server: { port: 0, admin_port: 0 }, routes: [{ name: 'r', method: 'POST', path: '/x', upstream: 'http://127.0.0.1:1', fence: 'off' }] })
      const res = await runCli(['serve', '--config', config, '--database-url', url])
      expect(res.code, url).toBe(1)
      expect(res.stderr, url).toContain('store failure (25006): the node is read-only (a hot standby')
    }
  })

  it('synchronous_commit set on the gateway\'s role counts over the server\'s default: the durability reading is taken in the gateway\'s own session', async () => {
    pair = await startPair(bin!, { sync: true })
    await pair.query(pair.primary, 'ALTER SYSTEM SET synchronous_commit = local')
    await pair.query(pair.primary, 'SELECT pg_reload_conf()')
    await pair.query(pair.primary, 'CREATE ROLE fencegate LOGIN SUPERUSER')
    await pair.query(pair.primary, 'ALTER ROLE fencegate SET synchronous_commit = on')
    const asRole = await start(`postgres://fencegate@127.0.0.1:${pair.primary.port}/postgres`, [])
    const asDefault = await start(`postgres://postgres@127.0.0.1:${pair.primary.port}/postgres`, [])
    expect((await health(asRole)).durability).toBe('replicated')
    expect((await health(asDefault)).durability).toBe('local')
  })

  it('an old primary that turned read-only is left for the writable host of the URL: the refused write committed nothing and runs again there', async () => {
    pair = await startPair(bin!, { sync: true })
    const lines: LogLine[] = []
    // The primary first, as a URL written before the failover would name it.
    const gw = await start(`postgres://postgres@127.0.0.1:${pair.primary.port},127.0.0.1:${pair.standby.port}/postgres`, lines)
    expect((await post(`${gw.dataUrl}/payments/a/capture`, '1')).status).toBe(200)
    await pair.query(pair.primary, 'ALTER SYSTEM SET default_transaction_read_only = on')
    await pair.query(pair.primary, 'SELECT pg_reload_conf()')
    // No host is writable now: refused, not forwarded.
    const forwarded = upstream.received.length
    await until('refused while no host is writable', async () => (await post(`${gw.dataUrl}/payments/a/capture`, '2')).json?.code === 'store_unavailable')
    expect(upstream.received.length).toBe(forwarded)
    pair.promote()
    await until('served on the promoted standby', async () => (await post(`${gw.dataUrl}/payments/a/capture`, '2')).status === 200)
    expect(lines.find((l) => l.event === 'store_failover')?.fields).toMatchObject({ from_timeline: 1, to_timeline: 2 })
    const fences = await pair.query<{ highest: string }>(pair.standby, `SELECT highest_fence::text AS highest FROM fg_fences WHERE entity = 'invoice:a'`)
    expect(fences[0]!.highest).toBe('2')
  })

  it('asynchronous replication with the standby cut off: the failover really loses acknowledged commits, and the gateway refuses instead of forwarding', async () => {
    pair = await startPair(bin!, { sync: false })
    const lines: LogLine[] = []
    const gw = await start(pair.url, lines)
    expect(await health(gw)).toMatchObject({ http: 200, durability: 'local' })
    expect(lines.some((l) => l.event === 'store_durability_local' && l.level === 'warn')).toBe(true)
    const job = async (path: string, body: unknown) => post(`${gw.dataUrl}/_fencegate/jobs${path}`, undefined, { body: JSON.stringify(body) })
    expect((await job('', { type: 'report', key: 'august' })).status).toBe(201)
    await pair.cut()
    // A claim the standby never sees: its fence could go to a second worker after the failover.
    const first = await job('/claim', { worker_id: 'w1' })
    expect(first.json.fence).toBe('1')
    const run = load(gw, ['a', 'b', 'c'])
    await until('commands acknowledged', async () => [...run.acked.values()].length === 3 && Math.min(...run.acked.values()) >= 5)
    await run.stop()

    pair.primary.stop('immediate')
    pair.promote()
    const forwarded = upstream.received.length
    // The first statement on the promoted standby is a claim: refused, not fence 1 again.
    let second = await job('/claim', { worker_id: 'w2' })
    for (let i = 0; second.json?.code === 'store_unavailable' && i < 100; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50))
      second = await job('/claim', { worker_id: 'w2' })
    }
    expect(second.status, JSON.stringify(second.json)).toBe(503)
    expect(second.json.code).toBe('store_lost_commits')
    // The loss is real: the promoted standby lacks fences the gateway acknowledged.
    const kept = await pair.query<{ entity: string; highest: string }>(pair.standby, 'SELECT entity, highest_fence::text AS highest FROM fg_fences')
    for (const [entity, fence] of run.acked) {
      expect(Number(kept.find((k) => k.entity === `invoice:${entity}`)?.highest ?? 0), entity).toBeLessThan(fence)
    }
    // A command the lost fence would have refused is refused, and so is every other.
    for (const [entity, fence] of run.acked) {
      const stale = await post(`${gw.dataUrl}/payments/${entity}/capture`, String(fence - 1))
      expect(stale.status, entity).toBe(503)
      if (stale.json.code !== 'store_unavailable') expect(stale.json.code).toBe('store_lost_commits')
    }
    await until('store_lost_commits', async () => (await post(`${gw.dataUrl}/payments/a/capture`, '1')).json?.code === 'store_lost_commits')
    expect(upstream.received.length).toBe(forwarded)
    expect(lines.find((l) => l.event === 'store_lost_commits')?.fields).toMatchObject({ from_timeline: 1, to_timeline: 2 })
    expect(await health(gw)).toMatchObject({ http: 503, refusing: 'store_lost_commits' })
  })

  it('asynchronous replication: a stored answer the failover lost is a lost commit, though the reservation before it survived', async () => {
    pair = await startPair(bin!, { sync: false })
    const lines: LogLine[] = []
    const gw = await start(pair.url, lines)
    const held = gate()
    upstream.handle(async (_, res) => {
      await held.opened
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"charged":true}')
    })
    const answered = post(`${gw.dataUrl}/payments/z/capture`, '1', { headers: { 'idempotency-key': 'z-1' } })
    await upstream.arrived(upstream.received.length + 1)
    // The reservation is on the standby; the answer stored next is not.
    const [{ lsn }] = await pair.query<{ lsn: string }>(pair.primary, 'SELECT pg_current_wal_lsn()::text AS lsn')
    await until('the standby replayed the reservation', async () => (await pair!.query<{ ok: boolean }>(pair!.standby, `SELECT pg_last_wal_replay_lsn() >= '${lsn}'::pg_lsn AS ok`))[0]!.ok)
    await pair.cut()
    held.open()
    expect((await answered).status).toBe(200)

    pair.primary.stop('immediate')
    pair.promote()
    // Without the answer's position the gateway knew only the reservation's, which survived:
    // it served on, and a retry of z-1 got outcome_unknown, not its replay (with
    // on_unknown_outcome: retry, a second execution).
    let next = await post(`${gw.dataUrl}/payments/y/capture`, '1')
    for (let i = 0; next.json?.code === 'store_unavailable' && i < 100; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50))
      next = await post(`${gw.dataUrl}/payments/y/capture`, '1')
    }
    expect(next.status, JSON.stringify(next.json)).toBe(503)
    expect(next.json.code).toBe('store_lost_commits')
    const kept = await pair.query<{ state: string }>(pair.standby, `SELECT state FROM fg_idempotency WHERE key = 'z-1'`)
    expect(kept).toEqual([{ state: 'in_flight' }])
  })

  it('two workers: a failover that lost only one worker\'s acknowledged commits is refused by both, and by a worker restarted after it', async () => {
    const t0 = performance.now()
    const phase = (what: string) => console.log(`two workers: ${what} at ${Math.round(performance.now() - t0)} ms`)
    pair = await startPair(bin!, { sync: false })
    phase('pair started')
    upstream ??= await startKeyCountingUpstream()
    const config = writeConfig({
      server: { port: 0, admin_port: 0, workers: 2 }, store: { connect_timeout: '1s', max_connections: 8 },
      routes: [{ name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: upstream.url, entity: 'invoice:{params.id}', fence: 'required' }],
    })
    const gw = await startGatewayProcess(['--config', config, '--database-url', pair.url])
    processes.push(gw)
    const workers = async () => ((await (await fetch(`${gw.adminUrl}/health`)).json()) as { workers?: number }).workers
    await until('both workers live', async () => (await workers()) === 2)
    phase('workers live')
    await pair.cut()
    // One connection, so one worker: it alone acknowledges fences the standby never gets.
    const one = new Agent({ connections: 1 })
    for (let fence = 1; fence <= 5; fence++) expect((await capture(gw.dataUrl, 'a', fence, one)).status).toBe(200)
    await one.close()
    const forwarded = upstream.received.length

    pair.primary.stop('immediate')
    pair.promote()
    phase('promoted')
    // Each command on a connection of its own: node:cluster hands them to the workers in turn,
    // so the worker that acknowledged nothing answers every other one.
    const answers: string[] = []
    await until('every worker refuses with store_lost_commits', async () => {
      const round = await Promise.all(Array.from({ length: 6 }, async () => (await capture(gw.dataUrl, 'a', 1)).code))
      answers.push(...round)
      return round.every((code) => code === 'store_lost_commits')
    })
    phase(`refused by both after ${answers.length} commands`)
    expect(answers.filter((a) => !['store_unavailable', 'store_lost_commits'].includes(a)), JSON.stringify(answers)).toEqual([])
    expect(upstream.received.length).toBe(forwarded)

    // A worker that dies now is restarted refusing, though its own store has no acknowledged write to judge.
    const pids = () => [...new Set(gw.lines.map((l) => JSON.parse(l) as { event: string; pid?: number }).filter((l) => l.event === 'listening').map((l) => l.pid!))]
    process.kill(pids()[0]!, 'SIGKILL')
    await until('a third worker started', async () => pids().length === 3 && (await workers()) === 2)
    phase('restarted')
    const after = await Promise.all(Array.from({ length: 6 }, async () => (await capture(gw.dataUrl, 'b', 1)).code))
    expect(after).toEqual(Array(6).fill('store_lost_commits'))
    expect(upstream.received.length).toBe(forwarded)
  }, 180_000)

  it('store.require_replicated: with the synchronous standby stopped nothing is forwarded, and commands are served again when it streams', async () => {
    pair = await startPair(bin!, { sync: true })
    const gw = await start(pair.url, [], { require_replicated: true })
    expect((await post(`${gw.dataUrl}/payments/a/capture`, '1')).status).toBe(200)
    const forwarded = upstream.received.length
    pair.standby.stop('fast')
    const stopped = performance.now()
    // Commits now wait for a standby that is gone: the command is answered, not forwarded.
    const waiting = await post(`${gw.dataUrl}/payments/a/capture`, '2')
    console.log(`a command waiting for the stopped standby was answered ${waiting.status} ${waiting.json?.code} after ${Math.round(performance.now() - stopped)} ms`)
    expect(waiting.status).toBe(503)
    expect(waiting.json.code).toBe('store_not_replicated')
    expect(waiting.headers.get('retry-after')).toBe('1')
    const refused = await post(`${gw.dataUrl}/payments/b/capture`, '1')
    expect(refused.json.code).toBe('store_not_replicated')
    expect(await health(gw)).toMatchObject({ http: 503, durability: 'local', refusing: 'store_not_replicated' })
    expect(upstream.received.length).toBe(forwarded)

    pair.standby.start()
    await until('served again', async () => (await post(`${gw.dataUrl}/payments/c/capture`, '1')).status === 200)
    expect(await health(gw)).toMatchObject({ http: 200, durability: 'replicated' })
  })

  it('store.require_replicated: with the synchronous standby partitioned (stopped, its connection open, still streaming to the primary) a command is answered 503 within seconds, not after wal_sender_timeout', async () => {
    pair = await startPair(bin!, { sync: true })
    const gw = await start(pair.url, [], { require_replicated: true })
    expect((await post(`${gw.dataUrl}/payments/a/capture`, '1')).status).toBe(200)
    const forwarded = upstream.received.length
    pair.freeze(pair.standby, true)
    const frozen = performance.now()
    try {
      const waiting = await post(`${gw.dataUrl}/payments/a/capture`, '2')
      console.log(`a command waiting for the partitioned standby was answered ${waiting.status} ${waiting.json?.code} after ${Math.round(performance.now() - frozen)} ms`)
      expect(waiting.status).toBe(503)
      expect(waiting.json.code).toBe('store_not_replicated')
      // The primary still counts the standby as streaming: what gave it away was the waiting commit.
      const streaming = await pair.query<{ n: number }>(pair.primary, `SELECT count(*)::int AS n FROM pg_stat_replication WHERE state = 'streaming'`)
      expect(streaming[0]!.n).toBe(1)
      expect(upstream.received.length).toBe(forwarded)
    } finally {
      pair.freeze(pair.standby, false)
    }
    await until('served again', async () => (await post(`${gw.dataUrl}/payments/c/capture`, '1')).status === 200)
    expect(await health(gw)).toMatchObject({ http: 200, durability: 'replicated' })
  })

  it('another cluster behind the same address is refused until the gateway restarts', async () => {
    const first = await startCluster(bin!)
    clusters.push(first)
    const lines: LogLine[] = []
    const gw = await start(first.url, lines)
    expect((await post(`${gw.dataUrl}/payments/a/capture`, '5')).status).toBe(200)
    const forwarded = upstream.received.length
    first.stop('fast')
    // A restored backup or a wrong DNS entry: another cluster, with the schema, on the same port.
    const other = await startCluster(bin!, { port: first.port })
    clusters.push(other)
    await (await openDb(other.url, '')).close()
    const answers: string[] = []
    await until('store_identity_changed', async () => {
      const res = await post(`${gw.dataUrl}/payments/a/capture`, '1')
      answers.push(`${res.status}:${res.json?.code}`)
      return res.json?.code === 'store_identity_changed'
    })
    expect(upstream.received.length, JSON.stringify(answers)).toBe(forwarded)
    expect(lines.some((l) => l.event === 'store_identity_changed')).toBe(true)
    expect(await health(gw)).toMatchObject({ http: 503, refusing: 'store_identity_changed' })
  })
})
