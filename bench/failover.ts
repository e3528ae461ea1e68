// The failover part of `npm run bench -- faults` (docs/operations.md#failover): a primary and
// a hot standby made by pg_basebackup, a real `fencegate serve` on the multi-host URL, load
// with rising fences; the primary killed (-m immediate) and the standby promoted. Reports how
// soon the same process serves on the promoted standby, what it answered meanwhile, and, with
// asynchronous replication and the standby cut off, how soon it refuses for lost commits.
// test/failover.test.ts checks the same behaviour without timing it.
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { runAsync } from '../test/helpers/cluster.js'
import { startPair } from '../test/helpers/replicated.js'
import { startGatewayProcess, writeConfig, type GatewayProcess } from '../test/helpers/process.js'

interface Answer { answer: string; at: number }

async function command(gateway: GatewayProcess, entity: number, fence: number): Promise<Answer> {
  try {
    const res = await fetch(`${gateway.dataUrl}/payments/${entity}/capture`, {
      method: 'POST', body: '{}', headers: { 'content-type': 'application/json', 'x-execution-fence': String(fence), 'idempotency-key': `${entity}-${fence}` },
      // A command the gateway never answers is a finding, not a hang of the bench.
      signal: AbortSignal.timeout(5000),
    })
    const body = await res.json() as { code?: string }
    return { answer: res.status === 200 ? '200' : `${res.status}:${body.code}`, at: performance.now() }
  } catch {
    return { answer: 'no answer', at: performance.now() }
  }
}

/** Eight loops of rising fences until `stop`; each retries a refused fence. */
function load(gateway: GatewayProcess) {
  let running = true
  const answers: Answer[] = []
  const loops = Array.from({ length: 8 }, async (_, entity) => {
    for (let fence = 1; running;) {
      const a = await command(gateway, entity, fence)
      answers.push(a)
      if (a.answer === '200') fence++
      else await new Promise((r) => setTimeout(r, 5))
    }
  })
  return { answers, stop: async () => { running = false; await Promise.all(loops) } }
}

const f = (ms: number) => `${Math.round(ms)} ms`

async function run(bin: string, sync: boolean): Promise<void> {
  // The upstream records when each command reached it: what was forwarded after the promotion.
  const arrivals: number[] = []
  const server = createServer((req, res) => req.resume().on('end', () => {
    arrivals.push(performance.now())
    res.end('{}')
  }))
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  const upstream = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const pair = await startPair(bin, { sync })
  const config = writeConfig({
    // info: the process helper waits for the `listening` line.
    server: { port: 0, admin_port: 0 }, log: { level: 'info' },
    routes: [{ name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream, entity: 'invoice:{params.id}', fence: 'required', idempotency: 'required' }],
  })
  const gateway = await startGatewayProcess(['--config', config, '--database-url', pair.url])
  try {
    if (!sync) await pair.cut()
    const traffic = load(gateway)
    await new Promise((r) => setTimeout(r, 1500))
    // pg_ctl runs beside the event loop: a blocking call would hold back the answers and
    // arrivals of its own duration and stamp them after it.
    await runAsync(join(bin, 'pg_ctl'), ['-D', join(pair.primary.dir, 'data'), '-m', 'immediate', '-w', 'stop'])
    const killed = performance.now()
    await runAsync(join(bin, 'pg_ctl'), ['-D', join(pair.standby.dir, 'data'), '-w', '-t', '30', 'promote'])
    const promoted = performance.now()
    await new Promise((r) => setTimeout(r, 2000))
    await traffic.stop()
    const after = traffic.answers.filter((a) => a.at > killed)
    const counts = new Map<string, number>()
    for (const a of after) counts.set(a.answer, (counts.get(a.answer) ?? 0) + 1)
    const forwarded = arrivals.filter((at) => at > promoted)
    const firstLost = after.find((a) => a.answer === '503:store_lost_commits')
    // An answer after the kill may be a command forwarded before it (its answer waited for the store).
    console.log(`${sync ? 'synchronous' : 'asynchronous, standby cut off'}: pg_ctl promote took ${f(promoted - killed)}; ${traffic.answers.length} commands, answered after the kill: ${[...counts].map(([a, n]) => `${n} × ${a}`).join(', ')}`)
    console.log(`  forwarded after pg_ctl promote returned: ${forwarded.length}${forwarded[0] !== undefined ? `, the first ${f(forwarded[0] - promoted)} after it` : ''}`)
    if (firstLost) console.log(`  first 503 store_lost_commits ${f(firstLost.at - promoted)} after pg_ctl promote returned`)
  } finally {
    await gateway.stop()
    pair.destroy()
    server.close()
  }
}

export async function runFailoverBench(bin: string): Promise<void> {
  await run(bin, true)
  await run(bin, false)
}
