// CPU per command of reading the key from the body: old (JSON.parse + duplicate-key scan) vs new (one strict reading).
const [oldDir, newDir] = process.argv.slice(2)
const { bodyWithKey } = await import(`${newDir}/dist/bench/traffic.js`)
const load = async (dir) => {
  const { entitySources } = await import(`${dir}/dist/src/gateway/command.js`)
  const { compileRoute } = await import(`${dir}/dist/src/gateway/route.js`)
  const { readKey } = await import(`${dir}/dist/src/gateway/key.js`)
  const { parseConfig } = await import(`${dir}/dist/src/config/schema.js`)
  const [rc] = parseConfig({ routes: [{ name: 'k', method: 'POST', path: '/p/:invoice_id/capture', upstream: 'http://127.0.0.1:9', entity: 'invoice:{params.invoice_id}', fence: 'required', idempotency: 'required', idempotency_key: '{body.idempotency_key}' }] }).routes
  const route = compileRoute(rc)
  return (bytes) => {
    const headers = new Headers({ 'content-type': 'application/json' })
    const s = entitySources({ headers }, new URL('http://x/p/1/capture'), { invoice_id: '1' }, bytes)
    if (route.readsBody) s.body()
    return readKey(route, s)
  }
}
const run = async (dir, label) => {
  const f = await load(dir)
  const bodies = Array.from({ length: 1000 }, (_, i) => new TextEncoder().encode(bodyWithKey(`k${i}`)))
  for (let i = 0; i < 50000; i++) f(bodies[i % 1000])
  const n = 200000
  const t0 = process.cpuUsage()
  for (let i = 0; i < n; i++) f(bodies[i % 1000])
  const d = process.cpuUsage(t0)
  console.log(label, ((d.user + d.system) / n).toFixed(2), 'µs CPU per command; body', bodies[0].length, 'bytes')
}
for (let r = 0; r < 3; r++) { await run(oldDir, 'old'); await run(newDir, 'new') }
