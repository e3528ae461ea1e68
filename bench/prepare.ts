import { Pool } from 'undici'
import type { Case } from './cases.js'
import { baseHeaders, pooled, requestBody, requests, type Outgoing, type Traffic } from './traffic.js'


/** Sends each key of the replay pool once, so that each is completed; what came back is the report line. */
export async function completeKeys(url: string, t: Traffic, connections: number, signal: AbortSignal): Promise<string> {
  const started = performance.now()
  const statuses = await sendEach(url, t, t.replayKeys, (i) => pooled(t, i), connections, signal)
  return `${t.replayKeys} keys completed in ${seconds(started)} s, statuses ${JSON.stringify(statuses)}`
}

/**
 * Presents the run's fence once for every entity a spread case draws from, so that each
 * measured request meets an entity that already holds it: the steady state of workers
 * calling at the fence they hold. Without it, the first rounds measure a mix of first
 * inserts (with their fence history rows) and repeats, in a proportion set by how long
 * priming ran. The hand-rolled systems are seeded the same way.
 */
export async function seedEntities(url: string, t: Traffic, connections: number, signal: AbortSignal): Promise<string> {
  const started = performance.now()
  const [head, tail = ''] = t.path.split('{id}')
  const statuses = await sendEach(url, t, t.ids, (i) => ({ path: `${head}${i}${tail}`, headers: {} }), connections, signal)
  return `${t.ids} entities seeded at ${url} in ${seconds(started)} s, statuses ${JSON.stringify(statuses)}`
}

/** Sends requests 0..count-1 over `connections` connections; the statuses that came back. */
async function sendEach(url: string, t: Traffic, count: number, make: (i: number) => Outgoing, connections: number, signal: AbortSignal): Promise<Record<string, number>> {
  const pool = new Pool(url, { connections, headersTimeout: 10_000, bodyTimeout: 10_000 })
  const statuses: Record<string, number> = {}
  let next = 0
  const worker = async () => {
    while (next < count && !signal.aborted) {
      const o = make(next++)
      try {
        const res = await pool.request({ path: o.path, method: 'POST', headers: { ...baseHeaders(t), ...o.headers }, body: o.body ?? requestBody })
        await res.body.arrayBuffer()
        statuses[res.statusCode] = (statuses[res.statusCode] ?? 0) + 1
      } catch {
        statuses.error = (statuses.error ?? 0) + 1
      }
    }
  }
  try {
    await Promise.all(Array.from({ length: Math.min(connections, count) }, worker))
  } finally {
    await pool.close()
  }
  return statuses
}

const seconds = (since: number) => ((performance.now() - since) / 1000).toFixed(1)

/**
 * One request of the case, to check that it does what the case claims before it is
 * measured: a 2xx, and a replay only where replays are expected. wrk counts statuses but
 * does not look at headers (that would cost it a Lua call per response).
 */
export async function probeCase(c: Case, url: string, t: Traffic): Promise<string | undefined> {
  const o = requests(t)()
  const res = await fetch(new URL(o.path, url), { method: 'POST', headers: { ...baseHeaders(t), ...o.headers }, body: o.body ?? requestBody, signal: AbortSignal.timeout(10_000) })
  const text = await res.text()
  if (res.status < 200 || res.status > 299) return `a probe request got ${res.status}: ${text.slice(0, 200)}`
  // An MCP refusal is a 200 too, which wrk counts as a success: the probe reads the JSON-RPC answer.
  // fg-mcp-upstream's answers come from the bench's upstream, not an MCP server.
  if ((t.key === 'meta' || t.key === 'meta-rest') && c.upstream === 'mcp' && !/^\{"result":/.test(text)) return `an MCP probe call was not answered with a result: ${text.slice(0, 200)}`
  const replayed = res.headers.get('idempotent-replayed') === 'true'
  if (t.key === 'replay' && !replayed) return 'a replay probe was not answered as a replay (no idempotent-replayed: true)'
  if (t.key !== 'replay' && replayed) return `a ${c.name} probe was answered as a replay`
  return undefined
}
