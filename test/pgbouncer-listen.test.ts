import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { validateRuleSet } from '../src/rules/schema.js'
import { changeRule, readRules } from '../src/rules/store.js'
import { connectPostgres } from '../src/store/postgres.js'
import type { Db } from '../src/store/db.js'
import { call, until } from './helpers/claim-gateway.js'
import { pgbouncerBinary, postgresBinaries, startCluster, startPgbouncer, type Cluster, type Pooler } from './helpers/cluster.js'
import { route } from './helpers/gateway.js'
import { metric, runCli, startGatewayProcess, writeConfig, type GatewayProcess } from './helpers/process.js'

/**
 * Behind PgBouncer in transaction mode, LISTEN cannot follow a client across server
 * connections. With `store.listen_url` pointing at PostgreSQL itself, a rule change and a job
 * start reach the gateway by notification; without it, by the 1 s version check and the
 * waiting claims' fallback poll (docs/deployment.md#pgbouncer). Which one it was is read from
 * the gateway's own reports (the `rules_loaded` line's `via`, the wake counters on /metrics),
 * never from a stopwatch.
 */
const bin = postgresBinaries()
const bouncer = pgbouncerBinary()
if (!bin || !bouncer) console.warn('store.listen_url behind PgBouncer: skipped (needs initdb/pg_ctl and Debian\'s pgbouncer)')

const wakes = (gw: GatewayProcess, reason: string) => metric(gw, `fencegate_job_claim_wakes{reason="${reason}"}`)

describe.skipIf(!bin || !bouncer)('store.listen_url behind PgBouncer in transaction mode', () => {
  let cluster: Cluster
  let pooler: Pooler
  let direct: Db
  /** With store.listen_url: notifications. */
  let listening: GatewayProcess
  /** Without: the fallbacks. */
  let polling: GatewayProcess
  const config = (store: Record<string, unknown>) => writeConfig({
    server: { port: 0, admin_port: 0 }, log: { level: 'info' }, store: { pooler: 'transaction', ...store },
    job_types: [{ name: 'report', lease: '30s' }],
    routes: [route('http://127.0.0.1:9')],
  })

  beforeAll(async () => {
    cluster = await startCluster(bin!)
    pooler = await startPgbouncer(bouncer!, cluster)
    listening = await startGatewayProcess(['--config', config({ listen_url: cluster.url }), '--database-url', pooler.url])
    polling = await startGatewayProcess(['--config', config({}), '--database-url', pooler.url])
    direct = connectPostgres(cluster.url)
  }, 120_000)

  afterAll(async () => {
    await Promise.all([listening, polling].map((g) => g?.stop()))
    await direct?.close()
    await pooler?.stop()
    cluster?.destroy()
  })

  it('refuses to start when store.listen_url does not connect, naming the field', async () => {
    const res = await runCli(['serve', '--config', config({ listen_url: 'postgres://postgres@127.0.0.1:1/postgres' }), '--database-url', pooler.url])
    expect(res.code).toBe(2)
    expect(res.stderr).toContain('store.listen_url: cannot connect')
  })

  it('delivers a rule change by notification with listen_url, and by the version check without', async () => {
    const current = await readRules(direct)
    const capture = current.rules.find((r) => r.name === 'capture')!
    const result = await changeRule(direct, {
      name: 'capture', rule: { ...capture, timeout_ms: 4321 }, changedBy: 'test', source: 'api',
      validate: (rules) => validateRuleSet(rules, 'none', false),
    })
    const loaded = (gw: GatewayProcess) => gw.lines.map((l) => JSON.parse(l) as { event: string; rule_version?: number; via?: string })
      .find((e) => e.event === 'rules_loaded' && e.rule_version === result.version)
    await until('both gateways load the change', () => Boolean(loaded(listening) && loaded(polling)))
    expect(loaded(listening)!.via).toBe('notification')
    expect(loaded(polling)!.via).toBe('version_check')
  })

  it('wakes a waiting claim by notification with listen_url, and by the fallback poll without', async () => {
    for (const [gw, key] of [[listening, 'a'], [polling, 'b']] as const) {
      const claim = call(`${gw.dataUrl}/_fencegate/jobs/claim`, { worker_id: `w-${key}`, types: ['report'], wait: 20 })
      // The claim is waiting (and, with a LISTEN, listening) before the job exists.
      await until('the claim waits', async () => (await metric(gw, 'fencegate_job_claims_waiting')) === 1)
      const started = await call(`${gw.dataUrl}/_fencegate/jobs`, { type: 'report', key: `job-${key}` })
      expect(started.status).toBe(201)
      const claimed = await claim
      expect([claimed.status, claimed.json.job_id]).toEqual([200, started.json.job_id])
    }
    expect([await metric(listening, 'fencegate_job_listen_active'), await wakes(listening, 'notified')]).toEqual([1, 1])
    expect([await metric(polling, 'fencegate_job_listen_active'), await wakes(polling, 'notified')]).toEqual([0, 0])
    expect(await wakes(polling, 'fallback_poll')).toBeGreaterThanOrEqual(1)
  })

  // Figures for docs/deployment.md#pgbouncer, printed, not asserted: how long a rule change
  // takes to be used, and a waiting claim to get a job started elsewhere, with and without.
  it('measures a rule change and a waiting claim with listen_url and without', async () => {
    const figures: Record<string, number[]> = { 'rule change, listen_url': [], 'rule change, fallback': [], 'waiting claim, listen_url': [], 'waiting claim, fallback': [] }
    for (let round = 0; round < 5; round++) {
      const current = await readRules(direct)
      const capture = current.rules.find((r) => r.name === 'capture')!
      const started = performance.now()
      const result = await changeRule(direct, {
        name: 'capture', rule: { ...capture, timeout_ms: 6000 + round }, changedBy: 'test', source: 'api',
        validate: (rules) => validateRuleSet(rules, 'none', false),
      })
      const done: Partial<Record<'listen_url' | 'fallback', number>> = {}
      const loaded = (gw: GatewayProcess) => gw.lines.some((l) => l.includes('"rules_loaded"') && (JSON.parse(l) as { rule_version?: number }).rule_version === result.version)
      await until('both gateways load the change', () => {
        if (done.listen_url === undefined && loaded(listening)) done.listen_url = performance.now() - started
        if (done.fallback === undefined && loaded(polling)) done.fallback = performance.now() - started
        return done.listen_url !== undefined && done.fallback !== undefined
      })
      figures['rule change, listen_url']!.push(done.listen_url!)
      figures['rule change, fallback']!.push(done.fallback!)
      for (const [gw, label] of [[listening, 'listen_url'], [polling, 'fallback']] as const) {
        const claim = call(`${gw.dataUrl}/_fencegate/jobs/claim`, { worker_id: `m-${label}`, types: ['report'], wait: 20 })
        await until('the claim waits', async () => (await metric(gw, 'fencegate_job_claims_waiting')) === 1)
        const at = performance.now()
        expect((await call(`${gw.dataUrl}/_fencegate/jobs`, { type: 'report', key: `m-${label}-${round}` })).status).toBe(201)
        expect((await claim).status).toBe(200)
        figures[`waiting claim, ${label}`]!.push(performance.now() - at)
      }
    }
    const summary = Object.entries(figures).map(([what, ms]) => {
      const sorted = [...ms].sort((x, y) => x - y)
      return `${what}: median ${sorted[2]!.toFixed(0)} ms, max ${sorted[4]!.toFixed(0)} ms`
    })
    console.info(`behind PgBouncer in transaction mode, 5 rounds: ${summary.join('; ')}`)
  }, 120_000)
})
