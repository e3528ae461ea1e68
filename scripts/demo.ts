// `npm run demo`: a double click and a stale worker against the demo upstream, narrated.
// Everything is real: the gateway on an embedded store in a temporary directory, the
// demo upstream and the HTTP between them, all on loopback ports the OS picks.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseConfig } from '../src/config/schema.js'
import { startDemoUpstream } from '../src/demo/upstream.js'
import { silentLogger } from '../src/observe/log.js'
import { startGateway } from '../src/runtime/node/gateway.js'

const dataDir = mkdtempSync(join(tmpdir(), 'fencegate-demo-'))
const upstream = await startDemoUpstream(0)
const config = parseConfig({
  server: { port: 0, admin_port: 0 },
  store: { data_dir: dataDir },
  routes: [{
    name: 'capture-payment', method: 'POST', path: '/payments/:invoice_id/capture', upstream: upstream.url,
    entity: 'invoice:{params.invoice_id:int}', fence: 'required', idempotency: 'required',
  }],
})
const gateway = await startGateway({ config, log: silentLogger })

async function capture(who: string, fence: number, key: string): Promise<void> {
  const res = await fetch(`${gateway.dataUrl}/payments/7/capture`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-execution-fence': String(fence), 'idempotency-key': key },
    body: JSON.stringify({ amount: 1299 }),
  })
  const body = await res.json() as Record<string, unknown>
  const replayed = res.headers.get('idempotent-replayed') === 'true' ? ' (replayed, no upstream call)' : ''
  const what = res.ok ? `charge #${String(body.charge_number)}` : `${String(body.code)}: ${String(body.detail)}`
  console.log(`  ${who.padEnd(32)} fence ${fence}, key ${key.padEnd(12)} -> ${res.status} ${what}${replayed}`)
}

try {
  console.log('Worker A holds the lease with fence 1 and captures invoice 7:')
  await capture('worker A', 1, 'capture-7')
  console.log('The user double-clicks; the same request arrives again:')
  await capture('worker A (double click)', 1, 'capture-7')
  console.log("A stalls; its lease expires. Worker B claims the job with fence 2 and retries A's step:")
  await capture('worker B', 2, 'capture-7')
  console.log('A wakes up and, not knowing it lost the lease, tries a new charge:')
  await capture('worker A (stale)', 1, 'capture-7-b')
  console.log(`The upstream charged invoice 7 ${upstream.charges.get('7') ?? 0} time(s).`)
  const audit = await (await fetch(`${gateway.adminUrl}/audit`)).json() as { items: { code: string; entity: string; presented_fence: string; highest_fence: string }[] }
  console.log('Audit trail:')
  for (const row of audit.items) console.log(`  ${row.code} ${row.entity} presented ${row.presented_fence}, highest ${row.highest_fence}`)
} finally {
  await gateway.close()
  await upstream.close()
  rmSync(dataDir, { recursive: true, force: true })
}
