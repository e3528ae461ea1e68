import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { createPinoLogger } from '../src/runtime/node/log.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { hmacAuthenticator, jwtAuth, token } from './helpers/tokens.js'
import { closedPort, startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * Bodies, tokens and upstream credentials never reach a log line, an audit row
 * or a problem body: every outcome below is driven with secrets in all of them.
 */
describe('secrets and payloads stay out of logs, audit rows and errors', () => {
  const lines: string[] = []
  const upstreamKey = 'sk_live_UPSTREAM_SECRET_123'
  const bodySecret = 'PERSONAL-DATA-4111111111111111'
  const idempotencyKey = 'order-7f3a-IDEMPOTENCY-KEY'
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway
  let jwt: string

  beforeAll(async () => {
    t = await backends()[0]!.open()
    upstream = await startUpstream((req, res) => {
      if (req.path.startsWith('/slow')) return
      res.end(`echo ${bodySecret}`)
    })
    const routes = [
      route(upstream.url, { idempotency: 'optional', upstream_headers: { Authorization: `Bearer ${upstreamKey}` }, claimed_tenant: 'body.tenant' }),
      route(upstream.url, { name: 'slow', path: '/slow/:invoice_id', timeout_ms: 100 }),
      route(`http://127.0.0.1:${await closedPort()}`, { name: 'down', path: '/down/:invoice_id' }),
    ]
    gw = await startTestGateway({
      config: testConfig(routes, { auth: jwtAuth, job_types: [{ name: 'report', lease: '45s' }] }),
      store: t.store,
      jobs: createJobStore(t.db),
      authenticate: await hmacAuthenticator(),
      // The Node gateway's logger (pino), at its most talkative level.
      log: createPinoLogger('debug', { write: (line: string) => { lines.push(line) } }),
    })
    jwt = await token({ sub: 'worker-9' })
  })
  afterAll(async () => {
    await gw.close()
    await upstream.close()
    await t.close()
  })

  it('holds for accepted, replayed, stale, refused, mismatched, unauthenticated and failed requests', async () => {
    const body = JSON.stringify({ card: bodySecret, tenant: 'acme' })
    const auth = { authorization: `Bearer ${jwt}` }
    const answers = [
      await post(`${gw.url}/payments/1/capture`, '5', { body, headers: { ...auth, 'idempotency-key': idempotencyKey } }),
      await post(`${gw.url}/payments/1/capture`, '5', { body, headers: { ...auth, 'idempotency-key': idempotencyKey } }),
      await post(`${gw.url}/payments/1/capture`, '4', { body, headers: auth }),
      await post(`${gw.url}/payments/1/capture`, '6', { body: JSON.stringify({ card: bodySecret, tenant: 'globex' }), headers: auth }),
      await post(`${gw.url}/payments/1/capture`, '0x1', { body, headers: auth }),
      await post(`${gw.url}/payments/1/capture`, '6', { body, headers: { authorization: `Bearer ${jwt}x` } }),
      await post(`${gw.url}/slow/2`, '1', { body, headers: auth }),
      await post(`${gw.url}/down/3`, '1', { body, headers: auth }),
    ]
    expect(answers.map((a) => a.status)).toEqual([200, 200, 409, 403, 400, 401, 504, 502])
    const audit = JSON.stringify(await t.store.listAudit({ limit: 100 }))
    expect(audit).toContain('worker-9')
    for (const secret of [upstreamKey, bodySecret, jwt]) {
      expect(lines.join('\n')).not.toContain(secret)
      expect(audit).not.toContain(secret)
      for (const a of answers.slice(2)) expect(a.text).not.toContain(secret)
    }
    // The upstream got its own credential, not the caller's token.
    expect(upstream.received[0]!.headers.authorization).toBe(`Bearer ${upstreamKey}`)
    // One decision line per request: identifiers, the key's hash and durations, never the key itself.
    expect(lines.join('\n')).not.toContain(idempotencyKey)
    const decisions = lines.map((l) => JSON.parse(l)).filter((l) => l.event === 'request')
    expect(decisions.map((d) => d.outcome)).toEqual(['forwarded', 'replayed', 'rejected', 'rejected', 'rejected', 'rejected', 'rejected', 'rejected'])
    const [forwarded, replayed] = decisions
    expect(forwarded).toMatchObject({ level: 'info', route: 'capture', entity: 'invoice:1', fence: '5', tenant: 'acme', status: 200 })
    expect(forwarded.request_id).toBe(answers[0]!.headers.get('x-request-id'))
    expect(forwarded.key_sha256).toMatch(/^[0-9a-f]{64}$/)
    expect(typeof forwarded.rule_version).toBe('number')
    expect(replayed.key_sha256).toBe(forwarded.key_sha256)
    for (const f of ['duration_ms', 'store_ms', 'upstream_ms']) expect(typeof forwarded[f], f).toBe('number')
    expect(decisions.find((d) => d.code === 'upstream_timeout')).toMatchObject({ route: 'slow', status: 504 })
    expect(typeof decisions.find((d) => d.code === 'upstream_timeout').upstream_ms).toBe('number')
    expect(decisions.every((d) => typeof d.time === 'string' && typeof d.duration_ms === 'number')).toBe(true)
  })

  it('holds for the lease events: payloads, output and results never reach a log line', async () => {
    // The job API's verbs need their scopes, and a worker is its token's sub (or a slot of it).
    const auth = { authorization: `Bearer ${await token({ sub: 'worker-9', scope: 'jobs:start jobs:work' })}` }
    const jobs = (path: string, body: unknown) => post(`${gw.url}/_fencegate/jobs${path}`, undefined, { body: JSON.stringify(body), headers: auth })
    const { json: job } = await jobs('', { type: 'report', key: 'r1', payload: { card: bodySecret } })
    const claimed = await jobs('/claim', { worker_id: 'worker-9/w1' })
    expect(claimed.json.payload.card).toBe(bodySecret)
    const holder = { worker_id: 'worker-9/w1', fence: claimed.json.fence }
    expect((await jobs(`/${job.job_id}/heartbeat`, holder)).status).toBe(200)
    expect((await jobs(`/${job.job_id}/append`, { ...holder, seq: 0, chunk: bodySecret })).status).toBe(200)
    expect((await jobs(`/${job.job_id}/complete`, { worker_id: 'worker-9/w2', fence: '9', result: bodySecret })).json.code).toBe('not_owner')
    expect((await jobs(`/${job.job_id}/complete`, { ...holder, result: bodySecret })).status).toBe(200)
    expect((await jobs(`/${job.job_id}/heartbeat`, holder)).json.code).toBe('lease_lost')
    const events = lines.map((l) => JSON.parse(l)).filter((l) => l.job_id === job.job_id)
    expect(events.map((e) => e.event)).toEqual(['job_claimed', 'heartbeat_ok', 'result_rejected', 'heartbeat_lost'])
    expect(events.every((e) => e.fence !== undefined)).toBe(true)
    for (const secret of [bodySecret, jwt]) expect(lines.join('\n')).not.toContain(secret)
  })
})
