import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createLogger } from '../src/log.js'
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
      config: testConfig(routes, { auth: jwtAuth }),
      store: t.store,
      authenticate: await hmacAuthenticator(),
      log: createLogger('debug', (line) => lines.push(line)),
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
      await post(`${gw.url}/payments/1/capture`, '5', { body, headers: { ...auth, 'idempotency-key': 'k1' } }),
      await post(`${gw.url}/payments/1/capture`, '5', { body, headers: { ...auth, 'idempotency-key': 'k1' } }),
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
    expect(lines.some((l) => l.includes('"outcome":"forwarded"'))).toBe(true)
  })
})
