import ky, { HTTPError, type KyInstance } from 'ky'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { gate, startUpstream, type TestUpstream } from './helpers/upstream.js'

/** The client of docs/recipes/ticket-api.md, as written there. */
function ticketClient(prefixUrl: string): KyInstance {
  return ky.create({
    prefixUrl,
    timeout: 15_000,
    retry: {
      limit: 3,
      methods: ['post'],
      statusCodes: [409, 502, 503, 504],
      afterStatusCodes: [409, 502, 503, 504],
      maxRetryAfter: 30_000,
    },
    hooks: {
      beforeRetry: [({ error }) => {
        // fencegate marks what a retry can fix with Retry-After; anything else is final.
        if (error instanceof HTTPError && !error.response.headers.has('retry-after')) throw error
      }],
    },
  })
}

/** The route of docs/recipes/ticket-api.md. */
const ticketsRoute = (upstream: string, extra: Record<string, unknown> = {}) => route(upstream, {
  name: 'tickets', path: '/tickets', entity: 'ticket:{body.ticket.external_id}', fence: 'optional', idempotency: 'required', ...extra,
})

describe.each(backends())('a ky client with retries through fencegate, on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway
  let created = 0
  let attempts = 0
  let client: KyInstance

  beforeEach(async () => {
    t = await backend.open()
    created = 0
    attempts = 0
    upstream = await startUpstream((_req, res) => {
      created++
      res.writeHead(201, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ id: `t_${created}` }))
    })
  })
  afterEach(async () => {
    await gw?.close()
    await upstream.close()
    await t.close()
  })
  const start = async (extra: Record<string, unknown> = {}) => {
    gw = await startTestGateway({ config: testConfig([ticketsRoute(upstream.url, extra)]), store: t.store })
    client = ticketClient(gw.url).extend({ hooks: { beforeRequest: [() => void attempts++] } })
  }
  const ticket = (id: string, title = 'Printer on fire') => ({ ticket: { external_id: id }, title })
  const rejection = async (call: Promise<unknown>): Promise<HTTPError> => {
    const err = await call.then(() => undefined, (e: unknown) => e)
    expect(err).toBeInstanceOf(HTTPError)
    return err as HTTPError
  }

  it('throws permanent refusals at once, with the code in the body', async () => {
    await start()
    await client.post('tickets', { json: ticket('T-1'), headers: { 'idempotency-key': 'a', 'x-execution-fence': '5' } }).json()
    attempts = 0
    const stale = await rejection(client.post('tickets', { json: ticket('T-1'), headers: { 'idempotency-key': 'b', 'x-execution-fence': '4' } }).json())
    expect(stale.response.status).toBe(409)
    expect(await stale.response.json()).toMatchObject({ code: 'stale_fence', error: { type: 'invalid_request_error', code: 'stale_fence' } })
    const reused = await rejection(client.post('tickets', { json: ticket('T-1', 'other'), headers: { 'idempotency-key': 'a' } }).json())
    expect(reused.response.status).toBe(422)
    expect(attempts).toBe(2)
    expect(created).toBe(1)
  })

  it('retries a refusal that carries Retry-After, after that long, and ends with the one result', async () => {
    const { opened, open } = gate()
    upstream.handle(async (_req, res) => {
      created++
      await opened
      res.writeHead(201, { 'content-type': 'application/json' })
      res.end('{"id":"t_slow"}')
    })
    await start({ idempotency_wait: 0, timeout_ms: 2000, idempotency_lock: '10s' })
    const original = post(`${gw.url}/tickets`, undefined, { body: JSON.stringify(ticket('T-2')), headers: { 'idempotency-key': 'slow' } })
    await upstream.arrived(1)
    let retryAfter: string | null = null
    // The original answers once the duplicate has been told to come back: on the refusal's
    // arrival, not in beforeRetry, which ky runs after waiting Retry-After (up to 2 s here, as
    // long as the original's timeout_ms; a slow run lost that race and got 502 outcome_unknown).
    const retried = client.extend({
      hooks: { afterResponse: [(_request, _options, response) => {
        if (response.status === 409) {
          retryAfter ??= response.headers.get('retry-after')
          open()
        }
      }] },
    })
    const result = await retried.post('tickets', { json: ticket('T-2'), headers: { 'idempotency-key': 'slow' } }).json()
    expect(result).toEqual({ id: 't_slow' })
    expect((await original).json).toEqual({ id: 't_slow' })
    expect(Number(retryAfter)).toBeGreaterThanOrEqual(1)
    expect(Number(retryAfter)).toBeLessThanOrEqual(2)
    expect(attempts).toBeGreaterThanOrEqual(2)
    expect(created).toBe(1)
  })
})
