import zendesk from 'node-zendesk'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { jsonOf, recipeRoutes, startFakeApi, type FakeApi } from './helpers/fake-api.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'

/**
 * A Zendesk-like upstream: `POST /api/v2/tickets.json` creating `{ ticket }` with an id,
 * no de-duplication of its own (each create is a ticket), and a subject of `fault:reset`
 * or `fault:stall`.
 */
function startFakeZendesk(): Promise<FakeApi> {
  return startFakeApi({
    keyOf: () => undefined,
    nameOf: (req) => String(jsonOf(req).ticket?.external_id ?? ''),
    faultOf: (req) => ({ 'fault:reset': 'reset', 'fault:stall': 'stall' } as const)[String(jsonOf(req).ticket?.subject) as 'fault:reset'],
    execute: (req, n) => {
      const t = jsonOf(req).ticket
      return { status: 201, headers: { location: `/api/v2/tickets/${n}.json` }, body: { ticket: { id: n, external_id: t.external_id, subject: t.subject, status: 'new', url: `https://example.zendesk.com/api/v2/tickets/${n}.json` } } }
    },
    reused: () => ({ status: 500, body: {} }),
  })
}

const STALE_DETAIL = 'fence 4 is lower than 5, the highest accepted for ticket:T-fenced'
const KEY_REQUIRED_DETAIL = 'route zendesk-tickets requires an idempotency key (body.ticket.external_id is missing from the request)'

describe.each(backends())('the node-zendesk SDK through fencegate, on $name', (backend) => {
  let t: TestDb
  let fake: FakeApi
  let gw: TestGateway
  /** A worker's client: node-zendesk has no per-request headers, so the fence is the client's. */
  const tickets = (fence?: string) => zendesk.createClient({
    username: 'agent@example.com', token: 'zd-token', endpointUri: `${gw.url}/api/v2`, throwOriginalException: true,
    ...(fence === undefined ? {} : { customHeaders: { 'X-Execution-Fence': fence } }),
  }).tickets

  beforeAll(async () => {
    t = await backend.open()
    fake = await startFakeZendesk()
    gw = await startTestGateway({ config: testConfig(recipeRoutes('zendesk', fake.upstream.url)), store: t.store })
  })
  afterAll(async () => {
    await gw?.close()
    await fake?.close()
    await t?.close()
  })

  const ticket = (externalId: string, subject = 'Printer on fire', body = 'It is on fire.') => ({ ticket: { external_id: externalId, subject, comment: { body } } })
  /** The problem's code in a result node-zendesk resolved with (typed as a ticket, which it is not). */
  const codeOf = (result: unknown) => (result as { code?: string }).code
  /** What node-zendesk throws: with `throwOriginalException`, `statusCode` and the parsed body as `result`. */
  type ZendeskError = Error & { statusCode?: number; result?: Record<string, unknown> }
  const thrown = async (call: Promise<unknown>): Promise<ZendeskError> => {
    const outcome = await call.then((value) => ({ value }), (error: unknown) => ({ error }))
    if (!('error' in outcome)) throw new Error(`resolved as ${JSON.stringify(outcome.value)}`)
    expect(outcome.error).toBeInstanceOf(Error)
    return outcome.error as ZendeskError
  }

  it('creates a ticket once; the same ticket created again, with another comment, gets the first ticket', async () => {
    const first = await tickets().create(ticket('T-plain'))
    const again = await tickets().create(ticket('T-plain', 'Printer on fire', 'Still on fire, 10 minutes later.'))
    expect(first.result).toMatchObject({ external_id: 'T-plain', status: 'new' })
    expect(again.result.id).toBe(first.result.id)
    expect(fake.executions.get('T-plain')).toBe(1)
    expect(fake.arrivals('T-plain')).toBe(1)
  })

  it('20 concurrent creates of 5 tickets (workers racing): 5 tickets, every caller gets its ticket', async () => {
    fake.holdUntilNames(5)
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => tickets().create(ticket(`T-conc-${i % 5}`, 'Printer on fire', `worker ${i}`))))
    fake.holdUntilNames(0)
    for (let k = 0; k < 5; k++) {
      const mine = results.filter((_, i) => i % 5 === k)
      expect(new Set(mine.map((r) => r.result.id)).size).toBe(1)
      expect(mine[0]!.result.external_id).toBe(`T-conc-${k}`)
      expect(fake.executions.get(`T-conc-${k}`)).toBe(1)
      expect(fake.arrivals(`T-conc-${k}`)).toBe(1)
    }
  })

  it('a stale fence: the create rejects, never forwarded, one audit row', async () => {
    expect((await tickets('5').create(ticket('T-fenced'))).result.id).toBeGreaterThan(0)
    const err = await thrown(tickets('4').create(ticket('T-fenced', 'Printer on fire', 'from the worker that lost it')))
    // node-zendesk sends Accept: application/json, so the problem comes as application/json, the
    // one type it reads a body of: its thrown error carries it as `result`; the message is the SDK's.
    expect([err.statusCode, err.message]).toEqual([409, 'Zendesk Error (409): Conflict'])
    expect(err.result).toMatchObject({ code: 'stale_fence', status: 409, detail: STALE_DETAIL, error: { code: 'stale_fence', message: STALE_DETAIL } })
    expect(fake.arrivals('T-fenced')).toBe(1)
    const audit = await (await fetch(`${gw.adminUrl}/audit?entity=ticket:T-fenced`)).json() as { items: { code: string }[] }
    expect(audit.items.filter((i) => i.code === 'stale_fence')).toHaveLength(1)
  })

  it('a reset after the ticket was created: the SDK resolves the 502 without a ticket, and no create of that ticket is sent again', async () => {
    const lost = await tickets().create(ticket('T-reset', 'fault:reset'))
    // A 502 is not in node-zendesk's error table: the call resolves, with the problem as its result, not a ticket.
    expect(lost.result?.id).toBeUndefined()
    expect([(lost.response as Response).status, codeOf(lost.result)]).toEqual([502, 'upstream_unreachable'])
    const again = await tickets().create(ticket('T-reset', 'fault:reset'))
    expect(again.result?.id).toBeUndefined()
    expect([(again.response as Response).status, codeOf(again.result)]).toEqual([502, 'outcome_unknown'])
    expect(fake.executions.get('T-reset')).toBe(1)
    expect(fake.arrivals('T-reset')).toBe(1)
  })

  it('Zendesk slower than the route\'s timeout_ms: the 504 resolves without a ticket too, and the ticket is not created twice', async () => {
    const quick = await startTestGateway({ config: testConfig(recipeRoutes('zendesk', fake.upstream.url).map((r) => ({ ...r, timeout_ms: 300 }))), store: t.store })
    try {
      const client = zendesk.createClient({ username: 'agent@example.com', token: 'zd-token', endpointUri: `${quick.url}/api/v2`, throwOriginalException: true }).tickets
      const late = await client.create(ticket('T-stall', 'fault:stall'))
      expect([(late.response as Response).status, late.result?.id, codeOf(late.result)]).toEqual([504, undefined, 'upstream_timeout'])
      const again = await client.create(ticket('T-stall', 'fault:stall'))
      expect([(again.response as Response).status, again.result?.id, codeOf(again.result)]).toEqual([502, undefined, 'outcome_unknown'])
      expect(fake.executions.get('T-stall')).toBe(1)
      expect(fake.arrivals('T-stall')).toBe(1)
    } finally {
      await quick.close()
    }
  })

  it('a call with no route is thrown as Zendesk\'s 404', async () => {
    const err = await thrown(tickets().show(1))
    expect([err.statusCode, err.message]).toEqual([404, 'Zendesk Error (404): Item not found'])
    expect(err.result).toMatchObject({ code: 'no_route' })
  })

  it('a create that names no external_id is refused: the route keys on it', async () => {
    const before = fake.upstream.received.length
    const err = await thrown(tickets().create({ ticket: { subject: 'No id', comment: { body: 'x' } } } as never))
    expect([err.statusCode, err.message]).toEqual([400, 'Zendesk Error (400): Bad Request'])
    expect(err.result).toMatchObject({ code: 'idempotency_key_required', detail: KEY_REQUIRED_DETAIL })
    expect(fake.upstream.received).toHaveLength(before)
  })

  it('without throwOriginalException, the SDK\'s own message carries the problem\'s detail (from error.message)', async () => {
    const plain = zendesk.createClient({ username: 'agent@example.com', token: 'zd-token', endpointUri: `${gw.url}/api/v2` }).tickets
    const err = await thrown(plain.create({ ticket: { subject: 'No id', comment: { body: 'x' } } } as never))
    expect(err.message).toBe(`Request processing failed: Zendesk Error (400): Bad Request - ${KEY_REQUIRED_DETAIL}`)
    expect([err.statusCode, err.result]).toEqual([undefined, undefined])
  })
})
