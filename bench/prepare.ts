import { Pool } from 'undici'
import type { Case } from './cases.js'
import { pooled, requestBody, requests, type Traffic } from './traffic.js'

const headersOf = (t: Traffic) => ({ 'content-type': 'application/json', 'x-execution-fence': t.fence })

/** Sends each key of the replay pool once, so that each is completed; what came back is the report line. */
export async function completeKeys(url: string, t: Traffic, connections: number, signal: AbortSignal): Promise<string> {
  const pool = new Pool(url, { connections, headersTimeout: 10_000, bodyTimeout: 10_000 })
  const statuses: Record<string, number> = {}
  let next = 0
  const started = performance.now()
  const worker = async () => {
    while (next < t.replayKeys && !signal.aborted) {
      const o = pooled(t, next++)
      try {
        const res = await pool.request({ path: o.path, method: 'POST', headers: { ...headersOf(t), ...o.headers }, body: requestBody })
        await res.body.arrayBuffer()
        statuses[res.statusCode] = (statuses[res.statusCode] ?? 0) + 1
      } catch {
        statuses.error = (statuses.error ?? 0) + 1
      }
    }
  }
  try {
    await Promise.all(Array.from({ length: Math.min(connections, t.replayKeys) }, worker))
  } finally {
    await pool.close()
  }
  return `${t.replayKeys} keys completed in ${((performance.now() - started) / 1000).toFixed(1)} s, statuses ${JSON.stringify(statuses)}`
}

/**
 * One request of the case, to check that it does what the case claims before it is
 * measured: a 2xx, and a replay only where replays are expected. wrk counts statuses but
 * does not look at headers (that would cost it a Lua call per response).
 */
export async function probeCase(c: Case, url: string, t: Traffic): Promise<string | undefined> {
  const o = requests(t)()
  const res = await fetch(new URL(o.path, url), { method: 'POST', headers: { ...headersOf(t), ...o.headers }, body: requestBody, signal: AbortSignal.timeout(10_000) })
  const text = await res.text()
  if (res.status < 200 || res.status > 299) return `a probe request got ${res.status}: ${text.slice(0, 200)}`
  const replayed = res.headers.get('idempotent-replayed') === 'true'
  if (t.key === 'replay' && !replayed) return 'a replay probe was not answered as a replay (no idempotent-replayed: true)'
  if (t.key !== 'replay' && replayed) return `a ${c.name} probe was answered as a replay`
  return undefined
}
