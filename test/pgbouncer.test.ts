import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { pgbouncerBinary, postgresBinaries, startCluster, startPgbouncer, type Cluster, type PoolMode, type Pooler } from './helpers/cluster.js'
import { post } from './helpers/gateway.js'
import { startGatewayProcesses, writeConfig, type GatewayProcess } from './helpers/process.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * Behind PgBouncer in transaction mode (each transaction may run on another server
 * connection), with `store.pooler: transaction`, and in session mode (no setting needed): two
 * gateways still execute each key once, refuse stale fences and audit them. Needs
 * initdb/pg_ctl and Debian's pgbouncer. The job API, rules and durability in both modes:
 * test/pgbouncer-modes.test.ts.
 */
const bin = postgresBinaries()
const bouncer = pgbouncerBinary()
if (!bin || !bouncer) console.warn('two gateways behind PgBouncer: skipped (needs initdb/pg_ctl and Debian\'s pgbouncer)')

describe.skipIf(!bin || !bouncer).each<PoolMode>(['transaction', 'session'])('two gateways behind PgBouncer in %s mode', (mode) => {
  let cluster: Cluster
  let pooler: Pooler
  let upstream: TestUpstream
  let gateways: GatewayProcess[] = []
  const executions = new Map<string, number>()

  beforeAll(async () => {
    cluster = await startCluster(bin!)
    pooler = await startPgbouncer(bouncer!, cluster, { mode })
    upstream = await startUpstream((req, res) => {
      const key = String(req.headers['idempotency-key'])
      executions.set(key, (executions.get(key) ?? 0) + 1)
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ key, execution: executions.get(key) }))
    })
    const config = writeConfig({
      server: { port: 0, admin_port: 0 },
      store: { pooler: mode === 'transaction' ? 'transaction' : 'none' },
      routes: [{
        name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: upstream.url,
        entity: 'invoice:{params.id}', fence: 'required', idempotency: 'required', idempotency_wait: '5s',
      }],
    })
    const args = ['--config', config, '--database-url', pooler.url]
    gateways = await startGatewayProcesses([args, args])
  }, 120_000)

  afterAll(async () => {
    await Promise.all(gateways.map((g) => g.stop()))
    await upstream?.close()
    await pooler?.stop()
    cluster?.destroy()
  })

  it('executes each of 10 keys once under 50 concurrent calls through two gateways, three rounds', async () => {
    for (let round = 0; round < 3; round++) {
      const answers = await Promise.all(Array.from({ length: 50 }, (_, i) =>
        post(`${gateways[i % 2]!.dataUrl}/payments/${i % 10}/capture`, '1', { headers: { 'idempotency-key': `k-${round}-${i % 10}` } })))
      expect(answers.map((a) => a.status)).toEqual(answers.map(() => 200))
      // Every duplicate got the one stored answer.
      for (const a of answers) expect(a.json.execution).toBe(1)
    }
    expect([...executions.entries()].sort()).toEqual(Array.from({ length: 30 }, (_, k) => [`k-${Math.floor(k / 10)}-${k % 10}`, 1]).sort())
  })

  it('refuses a stale fence and audits it', async () => {
    expect((await post(`${gateways[0]!.dataUrl}/payments/77/capture`, '9', { headers: { 'idempotency-key': 's-9' } })).status).toBe(200)
    const stale = await post(`${gateways[1]!.dataUrl}/payments/77/capture`, '8', { headers: { 'idempotency-key': 's-8' } })
    expect([stale.status, stale.json.code]).toEqual([409, 'stale_fence'])
    const audit = await (await fetch(`${gateways[0]!.adminUrl}/audit?entity=invoice:77`)).json() as { items: { code: string }[] }
    expect(audit.items.map((i) => i.code)).toEqual(['stale_fence'])
  })
})
