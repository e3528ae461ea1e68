// The failover part of `npm run bench -- faults` (docs/operations.md#failover): a primary and
// a hot standby made by pg_basebackup, a real `fencegate serve` on the multi-host URL, load
// with rising fences; the primary killed (-m immediate) and the standby promoted. Reports how
// soon the same process serves on the promoted standby, what it answered meanwhile, and, with
// asynchronous replication and the standby cut off, how soon it refuses for lost commits.
// test/failover.test.ts checks the same behaviour without timing it.
import { startPair } from '../test/helpers/replicated.js'
import { startGatewayProcess, writeConfig, type GatewayProcess } from '../test/helpers/process.js'

interface Answer { answer: string; at: number }

async function command(gateway: GatewayProcess, entity: number, fence: number): Promise<Answer> {
  try {
    const res = await fetch(`${gateway.dataUrl}/payments/${entity}/capture`, {
      method: 'POST', body: '{}', headers: { 'content-type': 'application/json', 'x-execution-fence': String(fence), 'idempotency-key': `${entity}-${fence}` },
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

async function run(bin: string, upstream: string, sync: boolean): Promise<void> {
  const pair = await startPair(bin, { sync })
  const config = writeConfig({
    server: { port: 0, admin_port: 0 }, log: { level: 'warn' },
    routes: [{ name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream, entity: 'invoice:{params.id}', fence: 'required', idempotency: 'required' }],
  })
  const gateway = await startGatewayProcess(['--config', config, '--database-url', pair.url])
  try {
    if (!sync) await pair.cut()
    const traffic = load(gateway)
    await new Promise((r) => setTimeout(r, 1500))
    pair.primary.stop('immediate')
    const killed = performance.now()
    pair.promote()
    const promoted = performance.now()
    await new Promise((r) => setTimeout(r, 2000))
    await traffic.stop()
    const after = traffic.answers.filter((a) => a.at > killed)
    const counts = new Map<string, number>()
    for (const a of after) counts.set(a.answer, (counts.get(a.answer) ?? 0) + 1)
    const firstServed = after.find((a) => a.at > promoted && a.answer === '200')
    const firstLost = after.find((a) => a.answer === '503:store_lost_commits')
    console.log(`${sync ? 'synchronous' : 'asynchronous, standby cut off'}: pg_ctl promote took ${f(promoted - killed)}; ${traffic.answers.length} commands, after the kill ${[...counts].map(([a, n]) => `${n} × ${a}`).join(', ')}`)
    if (firstServed) console.log(`  first command served on the promoted standby ${f(firstServed.at - promoted)} after pg_ctl promote returned`)
    if (firstLost) console.log(`  first 503 store_lost_commits ${f(firstLost.at - promoted)} after pg_ctl promote returned; none served after it: ${!after.some((a) => a.at > firstLost.at && a.answer === '200')}`)
  } finally {
    await gateway.stop()
    pair.destroy()
  }
}

export async function runFailoverBench(bin: string, upstream: string): Promise<void> {
  await run(bin, upstream, true)
  await run(bin, upstream, false)
}
