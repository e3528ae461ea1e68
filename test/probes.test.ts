import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { backends } from './helpers/backends.js'
import { until } from './helpers/claim-gateway.js'
import { post, route } from './helpers/gateway.js'
import { startGatewayProcess, writeConfig, type GatewayProcess } from './helpers/process.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * The admin plane's probes on a real `fencegate serve` (docs/deployment.md#probes): `/livez`
 * answers whenever the process serves, `/readyz` says whether to send it traffic, and SIGTERM
 * turns readiness off at once while both planes keep serving for `server.drain_delay`.
 */
async function probe(url: string): Promise<{ status: number; json: any }> {
  const res = await fetch(url)
  return { status: res.status, json: await res.json() }
}

function exited(gw: GatewayProcess): Promise<number | null> {
  return new Promise((resolve) => {
    if (gw.child.exitCode !== null || gw.child.signalCode !== null) return resolve(gw.child.exitCode)
    gw.child.once('exit', (code) => resolve(code))
  })
}

const upstreams: TestUpstream[] = []
const started: GatewayProcess[] = []
afterAll(async () => {
  await Promise.all(started.map((g) => g.stop()))
  await Promise.all(upstreams.map((u) => u.close()))
})

async function gatewayOn(args: string[], drainDelay: string): Promise<GatewayProcess> {
  const upstream = await startUpstream()
  upstreams.push(upstream)
  const config = writeConfig({ server: { port: 0, admin_port: 0, drain_delay: drainDelay }, log: { level: 'info' }, routes: [route(upstream.url)] })
  const gw = await startGatewayProcess(['--config', config, ...args])
  started.push(gw)
  return gw
}

describe('probes on the embedded store', () => {
  it('answers /livez and /readyz, and on SIGTERM fails readiness with draining while it still serves commands', async () => {
    // Long enough that the checks below run inside it even on a loaded machine (they need well under a second).
    const gw = await gatewayOn(['--data-dir', mkdtempSync(join(tmpdir(), 'fg-probes-'))], '10s')
    expect(await probe(`${gw.adminUrl}/livez`)).toEqual({ status: 200, json: { status: 'live' } })
    expect(await probe(`${gw.adminUrl}/readyz`)).toEqual({ status: 200, json: { status: 'ready' } })
    expect((await probe(`${gw.adminUrl}/health`)).json.status).toBe('ok')
    const before = await post(`${gw.dataUrl}/payments/1/capture`, '1')
    expect([before.status, before.headers.get('connection')]).toEqual([200, 'keep-alive'])

    const exit = exited(gw)
    gw.child.kill('SIGTERM')
    await until('readyz says draining', async () => (await probe(`${gw.adminUrl}/readyz`)).status === 503)
    expect(await probe(`${gw.adminUrl}/readyz`)).toEqual({ status: 503, json: { status: 'not_ready', reason: 'draining' } })
    // Still served during drain_delay, and the connection is closed after the answer.
    const during = await post(`${gw.dataUrl}/payments/2/capture`, '1')
    expect([during.status, during.headers.get('connection')]).toEqual([200, 'close'])
    expect((await probe(`${gw.adminUrl}/livez`)).status).toBe(200)
    expect(await exit).toBe(0)
    expect(gw.lines.some((l) => JSON.parse(l).event === 'draining')).toBe(true)
  }, 90_000)
})

const pg = backends().find((b) => b.name === 'postgres')
if (!pg) console.warn('DATABASE_URL is not set: the probe tests on PostgreSQL (a dropped database, a rolling update) are skipped')

describe.skipIf(!pg)('probes on PostgreSQL', () => {
  it('keeps /livez at 200 with its database dropped, while /readyz and /health say the store', async () => {
    const t = await pg!.open()
    await t.close()
    const gw = await gatewayOn(['--database-url', t.url!], '0s')
    expect((await probe(`${gw.adminUrl}/readyz`)).status).toBe(200)
    await t.breakStore()
    await until('readyz says store', async () => (await probe(`${gw.adminUrl}/readyz`)).status === 503)
    expect(await probe(`${gw.adminUrl}/readyz`)).toEqual({ status: 503, json: { status: 'not_ready', reason: 'store' } })
    expect(await probe(`${gw.adminUrl}/livez`)).toEqual({ status: 200, json: { status: 'live' } })
    expect((await probe(`${gw.adminUrl}/health`)).status).toBe(503)
  }, 30_000)

  it('plays a rolling update: one of two gateways drained while traffic runs through the ready ones, nothing refused or reset', async () => {
    const t = await pg!.open()
    await t.close()
    const [a, b] = [await gatewayOn(['--database-url', t.url!], '2s'), await gatewayOn(['--database-url', t.url!], '2s')]
    const lb = balancer([a!, b!])
    const failures: string[] = []
    let sent = 0
    const traffic = async (lane: number) => {
      while (!lb.stopped) {
        const target = lb.pick()
        // None ready for a moment: wait for the next readiness poll, as a balancer holds a request.
        if (!target) {
          await new Promise((resolve) => setImmediate(resolve))
          continue
        }
        const n = sent++
        // A command with a fence of its own entity: each one is answered 200 by whichever gateway.
        await post(`${target.dataUrl}/payments/${lane}-${n}/capture`, '1').then(
          (r) => void (r.status !== 200 && failures.push(`${r.status} ${r.json?.code}`)),
          (err: Error) => void failures.push(`${err.message}: ${(err.cause as Error | undefined)?.message}`),
        )
      }
    }
    const lanes = [0, 1, 2, 3].map(traffic)
    await until('traffic flows through both', () => lb.servedBy.get(a!)! > 5 && lb.servedBy.get(b!)! > 5)
    const exit = exited(a!)
    a!.child.kill('SIGTERM')
    expect(await exit).toBe(0)
    const after = sent
    await until('traffic flows on after the drain', () => sent > after + 20)
    lb.stop()
    await Promise.all(lanes)
    await lb.polling
    expect(failures).toEqual([])
    // The balancer took it out because it said draining, not because it stopped answering.
    expect(lb.sawDraining.has(a!)).toBe(true)
  }, 60_000)
})

/**
 * A load balancer as Kubernetes' endpoints are: a gateway gets traffic while its last
 * `/readyz` said ready; readiness is polled every 50 ms, round robin over the ready ones.
 */
function balancer(gateways: GatewayProcess[]) {
  const ready = new Set(gateways)
  const servedBy = new Map(gateways.map((g) => [g, 0]))
  const sawDraining = new Set<GatewayProcess>()
  let turn = 0
  const lb = {
    stopped: false,
    servedBy,
    sawDraining,
    pick(): GatewayProcess | undefined {
      const live = gateways.filter((g) => ready.has(g))
      const g = live[turn++ % live.length]
      if (g) servedBy.set(g, servedBy.get(g)! + 1)
      return g
    },
    stop: () => void (lb.stopped = true),
    polling: Promise.resolve(),
  }
  lb.polling = (async () => {
    while (!lb.stopped) {
      await Promise.all(gateways.map(async (g) => {
        const answer = await probe(`${g.adminUrl}/readyz`).catch(() => undefined)
        if (answer?.json?.reason === 'draining') sawDraining.add(g)
        if (answer?.status === 200) ready.add(g)
        else ready.delete(g)
      }))
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
  })()
  return lb
}
