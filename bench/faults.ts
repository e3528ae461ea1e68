// `npm run bench -- faults`: the store-fault run of docs/operations.md, with figures. A
// throwaway PostgreSQL cluster (initdb/pg_ctl on a free port), a real `fencegate serve`
// and a loopback upstream; faults injected from outside. It reports how long refusals take
// while PostgreSQL is down, how soon the same process serves again, and what a burst of
// backend terminations costs. The test suite checks the same behaviour with loose bounds
// (test/store-faults.test.ts); this is where the times are measured.
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { postgresBinaries, startCluster, type Cluster } from '../test/helpers/cluster.js'
import { startGatewayProcess, writeConfig, type GatewayProcess } from '../test/helpers/process.js'
import { runFailoverBench } from './failover.js'

interface Answer { answer: string; ms: number; at: number }

async function command(gateway: GatewayProcess, invoice: number, key: string): Promise<Answer> {
  const started = performance.now()
  try {
    const res = await fetch(`${gateway.dataUrl}/payments/${invoice}/capture`, {
      method: 'POST', body: '{}', headers: { 'content-type': 'application/json', 'x-execution-fence': '1', 'idempotency-key': key },
    })
    const body = await res.json() as { code?: string }
    return { answer: res.status === 200 ? '200' : `${res.status}:${body.code}`, ms: performance.now() - started, at: performance.now() }
  } catch {
    return { answer: 'no answer', ms: performance.now() - started, at: performance.now() }
  }
}

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))] ?? NaN
const f = (ms: number) => `${Math.round(ms)} ms`

async function killBurst(cluster: Cluster, gateway: GatewayProcess): Promise<void> {
  let running = true
  const answers: Answer[] = []
  const loops = Array.from({ length: 16 }, async (_, w) => {
    for (let n = 0; running; n++) answers.push(await command(gateway, w * 100 + (n % 50), `kill-${w}-${n}`))
  })
  await new Promise((r) => setTimeout(r, 1000))
  let kills = 0
  for (const until = performance.now() + 3000; performance.now() < until;) kills += await cluster.terminate('fencegate')
  const lastKill = performance.now()
  await new Promise((r) => setTimeout(r, 3000))
  running = false
  await Promise.all(loops)
  const failed = answers.filter((a) => a.answer !== '200')
  const lastFailure = Math.max(...failed.map((a) => a.at - a.ms), lastKill)
  const counts = new Map<string, number>()
  for (const a of failed) counts.set(a.answer, (counts.get(a.answer) ?? 0) + 1)
  console.log(`backends terminated: ${kills} over 3 s, ${answers.length} commands, gateway ${gateway.child.exitCode === null ? 'still running' : `exited ${gateway.child.exitCode}`}`)
  console.log(`  refused: ${[...counts].map(([a, n]) => `${n} × ${a}`).join(', ') || 'none'}; the last refused command was sent ${f(lastFailure - lastKill)} after the last kill`)
}

async function outage(cluster: Cluster, gateway: GatewayProcess): Promise<void> {
  cluster.stop('immediate')
  const refusals: Answer[] = []
  for (const until = performance.now() + 5000; performance.now() < until;) refusals.push(await command(gateway, 900, `down-${refusals.length}`))
  const h0 = performance.now()
  const health = await fetch(`${gateway.adminUrl}/health`)
  const healthMs = performance.now() - h0
  const ms = refusals.map((a) => a.ms)
  console.log(`PostgreSQL stopped (-m immediate): ${refusals.length} commands in 5 s, answers ${[...new Set(refusals.map((a) => a.answer))].join(', ')}`)
  console.log(`  refusal time p50 ${f(pct(ms, 0.5))}, p99 ${f(pct(ms, 0.99))}, max ${f(Math.max(...ms))}; /health ${health.status} in ${f(healthMs)}`)
  const restart = performance.now()
  cluster.start()
  const started = performance.now()
  let first: Answer | undefined
  for (let n = 0; !first; n++) {
    const a = await command(gateway, 950, `back-${n}`)
    if (a.answer === '200') first = a
  }
  console.log(`PostgreSQL restarted: pg_ctl start took ${f(started - restart)}; first command served ${f(first.at - started)} after it returned (that request ${f(first.ms)})`)
}

export async function runFaultsBench(): Promise<number> {
  const bin = postgresBinaries()
  if (!bin) {
    console.log('faults: initdb/pg_ctl not found; install PostgreSQL server binaries')
    return 1
  }
  const upstream = createServer((req, res) => req.resume().on('end', () => res.end('{}')))
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r))
  const cluster = await startCluster(bin)
  const config = writeConfig({
    server: { port: 0, admin_port: 0 },
    log: { level: 'info' },
    routes: [{
      name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`,
      entity: 'invoice:{params.id}', fence: 'required', idempotency: 'required',
    }],
  })
  const gateway = await startGatewayProcess(['--config', config, '--database-url', cluster.url])
  try {
    console.log('store.connect_timeout: 1s (default)')
    await killBurst(cluster, gateway)
    await outage(cluster, gateway)
    await runFailoverBench(bin)
    return gateway.child.exitCode === null ? 0 : 1
  } finally {
    await gateway.stop()
    cluster.destroy()
    upstream.close()
  }
}
