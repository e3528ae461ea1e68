import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import postgres from 'postgres'
import { call, until } from './helpers/claim-gateway.js'
import { pgbouncerBinary, postgresBinaries, startCluster, startPgbouncer, type Cluster, type PoolMode, type Pooler } from './helpers/cluster.js'
import { post } from './helpers/gateway.js'
import { metric, runCli, startGatewayProcesses, writeConfig, type GatewayProcess } from './helpers/process.js'
import { connectPostgres } from '../src/store/postgres.js'
import { settingsNotInEffect, urlSettings } from '../src/store/url-settings.js'
import { startKeyCountingUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * Every feature behind Debian's PgBouncer, in transaction mode (`store.pooler: transaction`, no
 * LISTEN without `store.listen_url`) and in session mode (nothing special: a client keeps its
 * server connection, so LISTEN and prepared statements work): the job API through a gateway of
 * `--workers 2` and a second gateway, a rule change reaching all three processes, and the
 * durability report and refusal. Which path delivered a wake-up or a rule change is read from
 * the gateway's own reports (the `rules_loaded` line's `via`, the wake counters), never from a
 * stopwatch (docs/deployment.md#pgbouncer).
 */
const bin = postgresBinaries()
const bouncer = pgbouncerBinary()
if (!bin || !bouncer) console.warn('PgBouncer in both pool modes: skipped (needs initdb/pg_ctl and Debian\'s pgbouncer)')

interface LogLine { event: string; worker?: number; rule_version?: number; via?: string }
const events = (gw: GatewayProcess) => gw.lines.map((l) => JSON.parse(l) as LogLine)

describe('the session settings a store URL asks for', () => {
  it('are its query parameters that are not the driver\'s, and the -c of its options', () => {
    expect(urlSettings('postgres://db/fg')).toEqual([])
    expect(urlSettings('postgres://h1:5432,h2:5432/fg?sslmode=require&target_session_attrs=read-write&application_name=x&max=3')).toEqual([])
    expect(urlSettings('postgres://db/fg?statement_timeout=5s&options=-c%20synchronous_commit%3Dremote_apply%20--lock-timeout%3D1s%20-cwork_mem%3D4MB'))
      .toEqual(['statement_timeout', 'synchronous_commit', 'lock_timeout', 'work_mem'])
  })
})

describe.skipIf(!bin || !bouncer)('behind PgBouncer', () => {
  let cluster: Cluster
  let upstream: TestUpstream & { executions: Map<string, number> }

  beforeAll(async () => {
    cluster = await startCluster(bin!)
    upstream = await startKeyCountingUpstream()
    // One database per pool mode, so the two suites' jobs and rules stay apart.
    const admin = postgres(cluster.url, { max: 1, onnotice: () => {} })
    for (const mode of ['transaction', 'session']) await admin.unsafe(`CREATE DATABASE fg_${mode}`)
    await admin.end()
  }, 120_000)

  afterAll(async () => {
    await upstream?.close()
    cluster?.destroy()
  })

  describe.each<PoolMode>(['transaction', 'session'])('in %s mode', (mode) => {
    let pooler: Pooler
    /** `--workers 2`. */
    let a: GatewayProcess
    let b: GatewayProcess
    /** `store.require_replicated` on a store without a standby. */
    let strict: GatewayProcess
    /** This mode's database through PgBouncer. */
    let url: string
    let config: (server: Record<string, unknown>, store?: Record<string, unknown>) => string
    const notifies = mode === 'session'
    const capture = () => ({
      name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: upstream.url,
      entity: 'invoice:{params.id}', fence: 'required', idempotency: 'required', idempotency_wait: '5s',
    })

    beforeAll(async () => {
      pooler = await startPgbouncer(bouncer!, cluster, { mode })
      url = pooler.url.replace(/\/postgres$/, `/fg_${mode}`)
      config = (server, store = {}) => writeConfig({
        server: { port: 0, admin_port: 0, ...server }, log: { level: 'info' },
        store: { pooler: mode === 'transaction' ? 'transaction' : 'none', max_connections: 16, ...store },
        job_types: [{ name: 'report', lease: '30s' }],
        routes: [capture()],
      })
      ;[a, b, strict] = await startGatewayProcesses([
        ['--config', config({ workers: 2 }), '--database-url', url],
        ['--config', config({}), '--database-url', url],
        ['--config', config({}, { require_replicated: true, max_connections: 2 }), '--database-url', url],
      ])
      await until('both workers live', async () => ((await (await fetch(`${a.adminUrl}/health`)).json()) as { workers?: number }).workers === 2)
    }, 120_000)

    afterAll(async () => {
      await Promise.all([a, b, strict].map((g) => g?.stop()))
      await pooler?.stop()
    })

    it('starts a job on one gateway and wakes a claim waiting on the other; heartbeat and completion hold', async () => {
      const claim = call(`${b.dataUrl}/_fencegate/jobs/claim`, { worker_id: 'w-1', types: ['report'], wait: 20 })
      await until('the claim waits', async () => (await metric(b, 'fencegate_job_claims_waiting')) === 1)
      const started = await call(`${a.dataUrl}/_fencegate/jobs`, { type: 'report', key: 'one', payload: { n: 1 } })
      expect(started.status).toBe(201)
      const claimed = await claim
      expect([claimed.status, claimed.json.job_id, claimed.json.fence, claimed.json.payload]).toEqual([200, started.json.job_id, '1', { n: 1 }])
      // Session mode carries the LISTEN; transaction mode without listen_url has none, and the fallback poll found it.
      expect(await metric(b, 'fencegate_job_listen_active')).toBe(notifies ? 1 : 0)
      expect(await metric(b, `fencegate_job_claim_wakes{reason="${notifies ? 'notified' : 'fallback_poll'}"}`)).toBeGreaterThanOrEqual(1)
      const jobUrl = `${a.dataUrl}/_fencegate/jobs/${started.json.job_id}`
      const beat = await call(`${jobUrl}/heartbeat`, { worker_id: 'w-1', fence: '1' })
      expect([beat.status, beat.json.lease_ms]).toEqual([200, 30_000])
      const stale = await call(`${jobUrl}/complete`, { worker_id: 'w-1', fence: '0', result: { ok: true } })
      expect([stale.status, stale.json.code]).toEqual([409, 'not_owner'])
      for (let i = 0; i < 2; i++) {
        const done = await call(`${jobUrl}/complete`, { worker_id: 'w-1', fence: '1', result: { ok: true } })
        expect([done.status, done.json.state]).toEqual([200, 'succeeded'])
      }
      const read = await call(`${b.dataUrl}/_fencegate/jobs/${started.json.job_id}`, undefined, { method: 'GET' })
      expect([read.json.state, read.json.result]).toEqual(['succeeded', { ok: true }])
    })

    it('starts a batch on one gateway, claims it on the other and completes it in one turn', async () => {
      const bulk = await call(`${a.dataUrl}/_fencegate/jobs/bulk`, { jobs: Array.from({ length: 5 }, (_, i) => ({ type: 'report', key: `batch-${i}` })) })
      expect([bulk.status, bulk.json.jobs.map((j: { created?: boolean }) => j.created)]).toEqual([200, [true, true, true, true, true]])
      const claimed = await call(`${b.dataUrl}/_fencegate/jobs/claim`, { worker_ids: ['s-1', 's-2', 's-3', 's-4', 's-5'], types: ['report'], max: 5 })
      expect(claimed.status).toBe(200)
      const jobs = claimed.json.jobs as { job_id: string; fence: string; worker_id: string }[]
      expect(jobs.map((j) => j.job_id).sort()).toEqual(bulk.json.jobs.map((j: { job_id: string }) => j.job_id).sort())
      const done = await Promise.all(jobs.map((j) => call(`${a.dataUrl}/_fencegate/jobs/${j.job_id}/complete`, { worker_id: j.worker_id, fence: j.fence })))
      expect(done.map((d) => d.status)).toEqual(jobs.map(() => 200))
      expect((await call(`${b.dataUrl}/_fencegate/jobs/claim`, { worker_id: 'w-2', types: ['report'] })).status).toBe(204)
    })

    it('executes each key once through both gateways, ten calls a key at once', async () => {
      const answers = await Promise.all(Array.from({ length: 40 }, (_, i) =>
        post(`${[a, b][i % 2]!.dataUrl}/payments/${mode}-${i % 4}/capture`, '1', { headers: { 'idempotency-key': `${mode}-${i % 4}` } })))
      expect(answers.map((x) => [x.status, x.json.code])).toEqual(answers.map(() => [200, undefined]))
      const mine = [...upstream.executions.entries()].filter(([k]) => k.startsWith(`${mode}-`)).sort()
      expect(mine).toEqual(Array.from({ length: 4 }, (_, i) => [`${mode}-${i}`, 1]))
    })

    it('brings a rule change to every process: by notification in session mode, by the version check in transaction mode', async () => {
      const put = await fetch(`${a.adminUrl}/rules/capture`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...capture(), timeout_ms: 4321 }) })
      expect(put.status).toBe(200)
      const { version } = await put.json() as { version: number }
      const loaded = (gw: GatewayProcess) => events(gw).filter((e) => e.event === 'rules_loaded' && e.rule_version === version)
      await until('three processes load the change', () => loaded(a).length === 2 && loaded(b).length === 1)
      const expected = notifies ? 'notification' : 'version_check'
      expect(loaded(b)[0]!.via).toBe(expected)
      // The worker that served the PUT used its change at once (or its own NOTIFY got there
      // first, in session mode); the other heard of it.
      const vias = loaded(a).map((e) => e.via)
      expect(vias).toContain(expected)
      expect(vias.filter((v) => v !== expected && v !== 'change')).toEqual([])
    })

    it('reports the store\'s durability, and refuses commands under require_replicated without a standby', async () => {
      for (const gw of [a, b]) expect(await (await fetch(`${gw.adminUrl}/health`)).json()).toMatchObject({ status: 'ok', store: 'up', durability: 'local' })
      const health = await fetch(`${strict.adminUrl}/health`)
      expect([health.status, await health.json()]).toEqual([503, { status: 'unavailable', store: 'up', durability: 'local', refusing: 'store_not_replicated' }])
      const before = upstream.executions.size
      const refused = await post(`${strict.dataUrl}/payments/strict/capture`, '1', { headers: { 'idempotency-key': `${mode}-strict` } })
      expect([refused.status, refused.json.code]).toEqual([503, 'store_not_replicated'])
      expect(upstream.executions.size).toBe(before)
    })

    it('refuses to start when PgBouncer drops a session setting the URL asks for, naming the setting', async () => {
      const res = await runCli(['serve', '--config', config({}), '--database-url', `${url}?statement_timeout=5000`])
      expect(res.code).toBe(2)
      expect(res.stderr).toContain('store.url: the session setting statement_timeout asked for in the URL is not in effect')
      // One PgBouncer does not ignore, it refuses: the start fails with its code and what it means.
      const refused = await runCli(['serve', '--config', config({}), '--database-url', `${url}?lock_timeout=1000`])
      expect([refused.code, refused.stderr]).toEqual([1, expect.stringContaining('(08P01)') as unknown])
      expect(refused.stderr).toContain('PgBouncer refuses a session setting given in store.url')
      // Straight to PostgreSQL the same URL's setting holds.
      for (const [to, missing] of [[`${url}?statement_timeout=5000`, ['statement_timeout']], [`${cluster.url}?statement_timeout=5000`, []]] as const) {
        const db = connectPostgres(to, { max: 1, pooler: mode === 'transaction' ? 'transaction' : 'none' })
        expect(await settingsNotInEffect(db, to)).toEqual(missing)
        await db.close()
      }
    })

    // Last: it kills this mode's PgBouncer. Figures, not bounds: printed, and in docs/deployment.md.
    it('fails closed while PgBouncer is killed under load, recovers when it returns, and executes nothing twice', async () => {
      const traffic = keyedLoad([a, b], `${mode}-kill`)
      await until('100 answers before the kill', () => traffic.answers.length >= 100, 60_000)
      await pooler.kill()
      // PgBouncer is gone now (its process has exited): what was sent before may still answer either way.
      const killedAt = performance.now()
      const inFlight = traffic.inFlight()
      await until('every command sent before the kill answered', () => inFlight.every((c) => c.answer !== undefined), 60_000)
      const forwardedAtKill = upstream.received.length
      await until('100 answers sent during the outage', () => traffic.answers.filter((c) => c.sent > killedAt).length >= 100, 60_000)
      const ready = await Promise.all([a, b].map(async (g) => {
        const r = await fetch(`${g.adminUrl}/readyz`)
        return [r.status, (await r.json() as { reason?: string }).reason]
      }))
      // Nothing was forwarded while PgBouncer was gone: every command sent then was refused.
      const forwardedInOutage = upstream.received.length - forwardedAtKill
      const restartedAt = performance.now()
      await pooler.restart()
      const during = traffic.answers.filter((c) => c.sent > killedAt && c.sent + c.ms < restartedAt)
      expect(forwardedInOutage).toBe(0)
      expect(during.filter((c) => c.answer !== '503:store_unavailable')).toEqual([])
      expect(ready).toEqual([[503, 'store'], [503, 'store']])
      await until('a command served through each gateway after the restart', () => [0, 1].every((g) => traffic.answers.some((c) => c.gateway === g && c.sent > restartedAt && c.answer === '200')), 60_000)
      await traffic.stop()
      // Afterwards: every answer was a documented one, every key that was not answered 200 is
      // retried with the same key, and no key ran twice.
      expect(traffic.answers.filter((c) => !documented.has(c.answer!))).toEqual([])
      const retried = await Promise.all(traffic.answers.filter((c) => c.answer !== '200').map((c) => keyed(c.gateway ? b : a, c.key)))
      expect(retried.filter((r) => !['200', '502:outcome_unknown'].includes(r))).toEqual([])
      const fresh = await Promise.all(Array.from({ length: 20 }, (_, i) => keyed([a, b][i % 2]!, `${mode}-after-${i}`)))
      expect(fresh).toEqual(fresh.map(() => '200'))
      expect([...upstream.executions.values()].filter((n) => n > 1)).toEqual([])
      const firstBack = [0, 1].map((g) => Math.min(...traffic.answers.filter((c) => c.gateway === g && c.sent > restartedAt && c.answer === '200').map((c) => c.sent + c.ms)) - restartedAt)
      const refusals = during.map((c) => c.ms).sort((x, y) => x - y)
      console.info(`pgbouncer ${mode} mode killed: ${during.length} commands refused 503 in the outage, p50 ${refusals[Math.floor(refusals.length / 2)]!.toFixed(1)} ms, max ${refusals.at(-1)!.toFixed(1)} ms; first 200 after restart: ${firstBack.map((ms) => ms.toFixed(0)).join(' / ')} ms (gateway a / b); ${traffic.answers.length} commands in all, ${retried.length} retried`)
    }, 120_000)
  })
})

// Every answer a keyed, fenced command may get while its store misbehaves (as in test/store-faults.test.ts).
const documented = new Set(['200', '409:request_in_progress', '502:outcome_unknown', '503:store_unavailable'])

/** One keyed command, its answer as `status` or `status:code`. */
async function keyed(gw: GatewayProcess, key: string): Promise<string> {
  try {
    const r = await post(`${gw.dataUrl}/payments/${key}/capture`, '1', { headers: { 'idempotency-key': key } })
    return r.status === 200 ? '200' : `${r.status}:${r.json?.code}`
  } catch (err) {
    return `no answer: ${(err as { cause?: { code?: string } }).cause?.code ?? String(err)}`
  }
}

interface Sent { gateway: number; key: string; sent: number; ms: number; answer?: string }

/** Eight loops of keyed commands through `gateways` until `stop`; each command a new key. */
function keyedLoad(gateways: GatewayProcess[], prefix: string) {
  let running = true
  const sent: Sent[] = []
  const loops = Array.from({ length: 8 }, async (_, w) => {
    for (let n = 0; running; n++) {
      const c: Sent = { gateway: w % gateways.length, key: `${prefix}-${w}-${n}`, sent: performance.now(), ms: 0 }
      sent.push(c)
      c.answer = await keyed(gateways[c.gateway]!, c.key)
      c.ms = performance.now() - c.sent
    }
  })
  return {
    /** The commands answered so far. */
    get answers() {
      return sent.filter((c) => c.answer !== undefined)
    },
    inFlight: () => sent.filter((c) => c.answer === undefined),
    stop: async () => {
      running = false
      await Promise.all(loops)
    },
  }
}
