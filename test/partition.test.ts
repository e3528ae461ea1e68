import { afterAll, describe, expect, it } from 'vitest'
import { FencegateClient, LeaseLost, type Lease, type WorkEvent } from '../src/client/index.js'
import { backends, type TestDb } from './helpers/backends.js'
import { startGatewayProcesses, writeConfig, type GatewayProcess } from './helpers/process.js'
import { startRelay, type Relay } from './helpers/relay.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const postgres = backends().find((b) => b.name === 'postgres')

async function until(check: () => boolean | Promise<boolean>): Promise<void> {
  while (!(await check())) await new Promise((r) => setTimeout(r, 20))
}

/** One step of the report job, fenced and keyed by the SDK, through the given gateway. */
const runStep = (lease: Lease, gateway: string, step: string) =>
  lease.step(step, () => lease.fetch(`${gateway}/reports/${lease.jobId}/${step}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ step }) }))

describe.skipIf(!postgres)('the partition test: two gateway processes on one PostgreSQL', () => {
  let t: TestDb
  let upstream: TestUpstream
  let gateways: GatewayProcess[] = []
  let relay: Relay

  afterAll(async () => {
    await relay?.close()
    await Promise.all(gateways.map((g) => g.stop()))
    await upstream?.close()
    await t?.close()
  })

  it('a worker cut off from its gateway cannot renew, append or complete; its delayed command is refused and audited; each step ran once; the result is its successor\'s', async () => {
    t = await postgres!.open()
    upstream = await startUpstream((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ path: req.path, fence: req.headers['x-execution-fence'] }))
    })
    const config = writeConfig({
      server: { port: 0, admin_port: 0 },
      log: { level: 'info' },
      job_types: [{ name: 'report', lease: '2s' }],
      routes: [{ name: 'report-step', method: 'POST', path: '/reports/:job/:step', upstream: upstream.url, entity: 'job:{header.X-Job-Id}', fence: 'lease', idempotency: 'required' }],
    })
    const args = ['--config', config, '--database-url', t.url!]
    gateways = await startGatewayProcesses([args, args])
    const [g1, g2] = gateways as [GatewayProcess, GatewayProcess]
    relay = await startRelay(Number(new URL(g1.dataUrl).port))
    const w1 = new FencegateClient({ baseUrl: relay.url })
    const w2 = new FencegateClient({ baseUrl: g2.dataUrl })
    const { job_id } = await w2.start({ type: 'report', key: 'acme:2026-08', payload: { account: 'acme' } })

    // W1 claims through its gateway and does the first step.
    const { lease: l1 } = (await w1.claim({ types: ['report'], workerId: 'w1' }))!
    expect(l1.fence).toBe('1')
    expect((await runStep(l1, relay.url, 'fetch-data')).status).toBe(200)
    await l1.append({ step: 'fetch-data', by: 'w1' })

    // The partition: W1's next command goes into the network and stays there.
    relay.cut()
    const delayed = runStep(l1, relay.url, 'render').then((res) => res.status, (err: unknown) => err)
    await until(() => relay.held() > 0)
    await until(async () => (await t.db.sql<{ expired: boolean }>`SELECT lease_until <= now() AS expired FROM fg_jobs WHERE id = ${job_id}::bigint`)[0]!.expired)
    // W1's local deadline is never later than the database's, so W1 has stopped by now.
    expect(l1.ownership).toBe('lost')
    expect(await delayed).toBeInstanceOf(LeaseLost)

    // W2 claims the same job on the other gateway and runs every step; it records only the steps W1 did not.
    const events: WorkEvent[] = []
    const replayed: Record<string, string | null> = {}
    const stop = new AbortController()
    await w2.work({ types: ['report'], workerId: 'w2', signal: stop.signal, claimWait: 1, onEvent: (e) => {
      events.push(e)
      if (e.type !== 'claimed') stop.abort()
    } }, async (_job, lease) => {
      for (const [i, step] of ['fetch-data', 'render'].entries()) {
        replayed[step] = (await runStep(lease, g2.dataUrl, step)).headers.get('idempotent-replayed')
        if (i >= lease.cursor) await lease.append({ step, by: 'w2' })
      }
      return { by: 'w2', fence: lease.fence }
    })
    expect(events).toEqual([{ type: 'claimed', jobId: job_id, fence: '2' }, { type: 'completed', jobId: job_id, fence: '2' }])
    expect(replayed).toEqual({ 'fetch-data': 'true', render: null })

    // The network comes back: the held bytes are delivered to W1's gateway.
    relay.restore()
    // W1's SDK sends nothing more under the lost lease...
    await expect(l1.append({ step: 'render', by: 'w1' })).rejects.toBeInstanceOf(LeaseLost)
    await expect(l1.complete({ by: 'w1' })).rejects.toBeInstanceOf(LeaseLost)
    // ...and its gateway refuses the same calls made by hand over the restored network.
    const asW1 = async (action: string, body: Record<string, unknown>) => {
      const res = await fetch(`${relay.url}/_fencegate/jobs/${job_id}/${action}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ worker_id: 'w1', fence: '1', ...body }) })
      return [res.status, ((await res.json()) as { code: string }).code]
    }
    expect(await asW1('heartbeat', {})).toEqual([409, 'lease_lost'])
    expect(await asW1('append', { seq: 1, chunk: { step: 'render', by: 'w1' } })).toEqual([409, 'lease_lost'])
    expect(await asW1('complete', { result: { by: 'w1' } })).toEqual([409, 'not_owner'])

    // The delayed command reached W1's gateway late, was refused there, and is in the audit trail.
    const auditOf = async () => {
      const res = await fetch(`${g1.adminUrl}/audit?entity=job:${job_id}`)
      return ((await res.json()) as { items: { code: string; idempotency_key: string | null; presented_fence: string; path: string }[] }).items
    }
    await until(async () => (await auditOf()).some((a) => a.idempotency_key === `fg.${job_id}.render`))
    const audit = await auditOf()
    expect(audit.find((a) => a.idempotency_key === `fg.${job_id}.render`)).toMatchObject({ code: expect.stringMatching(/^(lease_expired|stale_fence)$/), presented_fence: '1', path: `/reports/${job_id}/render` })
    expect(audit.filter((a) => a.code === 'result_rejected')).toMatchObject([{ presented_fence: '1' }])

    // Exactly one side effect per step, and the result is W2's.
    const byStep = (step: string) => upstream.received.filter((r) => r.path === `/reports/${job_id}/${step}`)
    expect(byStep('fetch-data').map((r) => r.headers['x-execution-fence'])).toEqual(['1'])
    expect(byStep('render').map((r) => r.headers['x-execution-fence'])).toEqual(['2'])
    const job = await w2.getJob(job_id, 0)
    expect(job).toMatchObject({ state: 'succeeded', owner: 'w2', fence: '2', result: { by: 'w2', fence: '2' } })
    expect(job.chunks).toEqual([{ step: 'fetch-data', by: 'w1' }, { step: 'render', by: 'w2' }])
  })
})
