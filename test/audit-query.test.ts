import { describe, expect, it } from 'vitest'
import { parseAuditQuery } from '../src/admin/app.js'
import { FencegateError } from '../src/http/problems.js'

const parse = (query: string | Record<string, string> | [string, string][]) => parseAuditQuery(new URLSearchParams(query))

/** Requires parseAuditQuery to fail with invalid_query about `parameter`. */
function rejects(query: string | Record<string, string> | [string, string][], parameter: string): FencegateError {
  let err: unknown
  try {
    parse(query)
  } catch (e) {
    err = e
  }
  expect(err, `expected ${JSON.stringify(query)} to be rejected`).toBeInstanceOf(FencegateError)
  const problem = err as FencegateError
  expect(problem.code).toBe('invalid_query')
  expect(problem.status).toBe(400)
  expect(problem.extras).toEqual({ parameter })
  return problem
}

describe('parseAuditQuery accepts', () => {
  it('no parameters, with a default limit of 100', () => {
    expect(parse('')).toEqual({ limit: 100 })
  })

  it('every parameter at once', () => {
    expect(parse({
      tenant: 'acme',
      entity: 'invoice:42',
      code: 'stale_fence',
      route: 'capture-payment',
      since: '2026-11-29T10:00:00Z',
      until: '2026-11-30T10:00:00.123456+01:00',
      limit: '50',
      cursor: '12345',
    })).toEqual({
      tenant: 'acme',
      entity: 'invoice:42',
      code: 'stale_fence',
      route: 'capture-payment',
      since: '2026-11-29T10:00:00Z',
      until: '2026-11-30T10:00:00.123456+01:00',
      limit: 50,
      before: '12345',
    })
  })

  it('percent-encoded values, decoded', () => {
    expect(parse('entity=invoice%3A42%2Fa%20b&tenant=t%C3%A9')).toMatchObject({ entity: 'invoice:42/a b', tenant: 'té' })
  })

  it.each([
    ['1', 1],
    ['100', 100],
    ['999', 999],
    ['1000', 1000],
    ['0005', 5],
  ])('limit=%s', (limit, expected) => {
    expect(parse({ limit }).limit).toBe(expected)
  })

  it.each(['0', '1', '9223372036854775807', '1234567890123456789'])('cursor=%s as before', (cursor) => {
    expect(parse({ cursor }).before).toBe(cursor)
  })

  it.each(['stale_fence', 'invalid_fence', 'fence_required', 'entity_unresolved', 'a', 'x'.repeat(64)])('code=%s', (code) => {
    expect(parse({ code }).code).toBe(code)
  })

  it.each(['capture', 'capture-payment', 'v1.capture_2', 'A', `a${'b'.repeat(63)}`, 'tickets-mcp/create_ticket', 'tickets-mcp/tasks/cancel'])('route=%s', (route) => {
    expect(parse({ route }).route).toBe(route)
  })

  it('a tenant of 128 characters and an entity of 512, of any characters', () => {
    const tenant = 't'.repeat(128)
    const entity = `${'e'.repeat(500)}\n:/ ?&=#é`.padEnd(512, 'z')
    expect(entity).toHaveLength(512)
    expect(parse({ tenant, entity })).toMatchObject({ tenant, entity })
  })

  it.each([
    ['250ms', 250],
    ['30s', 30_000],
    ['15m', 900_000],
    ['1h', 3_600_000],
    ['24h', 86_400_000],
    ['7d', 604_800_000],
    ['0m', 0],
  ])('since=%s as a duration of %d ms', (since, ms) => {
    const q = parse({ since })
    expect(q.sinceMs).toBe(ms)
    expect(q.since).toBeUndefined()
    expect(q.untilMs).toBeUndefined()
  })

  it.each([
    ['15m', 900_000],
    ['1h', 3_600_000],
    ['7d', 604_800_000],
  ])('until=%s as a duration of %d ms', (until, ms) => {
    const q = parse({ until })
    expect(q.untilMs).toBe(ms)
    expect(q.until).toBeUndefined()
    expect(q.sinceMs).toBeUndefined()
  })

  it('since and until together, one as a duration and one as a time', () => {
    expect(parse({ since: '7d', until: '2026-11-29T10:00:00Z' })).toEqual({ limit: 100, sinceMs: 604_800_000, until: '2026-11-29T10:00:00Z' })
  })

  it.each([
    '2026-11-29T10:00:00Z',
    '2026-11-29T10:00Z',
    '2026-11-29T10:00:00.5Z',
    '2026-11-29T10:00:00.123456Z',
    '2026-11-29T10:00:00+00:00',
    '2026-11-29T10:00:00+05:30',
    '2026-11-29T10:00:00-08:00',
    '2026-11-29T10:00+02:00',
    '2024-02-29T00:00:00Z',
  ])('since=%s as an ISO-8601 time, unchanged', (since) => {
    const q = parse({ since })
    expect(q.since).toBe(since)
    expect(q.sinceMs).toBeUndefined()
  })

  it('until as an ISO-8601 time', () => {
    expect(parse({ until: '2026-11-29T10:00:00Z' }).until).toBe('2026-11-29T10:00:00Z')
  })
})

describe('parseAuditQuery rejects', () => {
  it.each(['foo', 'offset', 'page', 'Limit', 'TENANT', 'before', 'entity_id', 'since_ms', ''])('the unknown parameter %j', (name) => {
    const err = rejects([[name, '1']], name)
    expect(err.detail).toBe(`unknown parameter ${name}`)
  })

  it('an unknown parameter even next to valid ones', () => {
    rejects('limit=10&sort=asc&tenant=acme', 'sort')
  })

  it.each(['tenant', 'entity', 'code', 'route', 'since', 'until', 'limit', 'cursor'])('a repeated %s', (name) => {
    const value = { tenant: 'a', entity: 'e', code: 'stale_fence', route: 'r', since: '1h', until: '1h', limit: '10', cursor: '5' }[name]!
    rejects([[name, value], [name, value]], name)
  })

  it.each(['0', '1001', '9999', '10000', 'abc', '', '-1', '+1', '1.5', '1e2', ' 5', '5 ', '0x10'])('limit=%j', (limit) => {
    rejects({ limit }, 'limit')
  })

  it.each(['', 'abc', '-1', '+1', '1.5', '0x1f', '12345678901234567890', ' 1', 'MTIz'])('cursor=%j', (cursor) => {
    rejects({ cursor }, 'cursor')
  })

  it.each(['', 'Stale_Fence', 'STALE_FENCE', 'stale-fence', 'stale fence', 'stale_fence1', 'x'.repeat(65), "x' OR 1=1"])('code=%j', (code) => {
    rejects({ code }, 'code')
  })

  it.each(['', '-capture', '_capture', 'a b', 'a/', '/b', 'a/-b', 'a'.repeat(65)])('route=%j', (route) => {
    rejects({ route }, 'route')
  })

  it('an empty tenant or one over 128 characters', () => {
    rejects({ tenant: '' }, 'tenant')
    rejects({ tenant: 't'.repeat(129) }, 'tenant')
  })

  it('an empty entity or one over 512 characters', () => {
    rejects({ entity: '' }, 'entity')
    rejects({ entity: 'e'.repeat(513) }, 'entity')
  })

  it.each([
    ['an ISO time without a zone', '2026-11-29T10:00:00'],
    ['an ISO time without a zone or seconds', '2026-11-29T10:00'],
    ['a date alone', '2026-11-29'],
    ['a space instead of T', '2026-11-29 10:00:00Z'],
    ['a lower-case z', '2026-11-29T10:00:00z'],
    ['a zone without a colon', '2026-11-29T10:00:00+0200'],
    ['a zone of hours alone', '2026-11-29T10:00:00+02'],
    ['seven fraction digits', '2026-11-29T10:00:00.1234567Z'],
    ['a fraction without seconds', '2026-11-29T10:00.5Z'],
    ['month 13', '2026-13-01T00:00:00Z'],
    ['hour 25', '2026-11-29T25:00:00Z'],
    ['minute 60', '2026-11-29T10:60:00Z'],
    ['a two-digit year', '26-11-29T10:00:00Z'],
    ['an RFC 2822 date', 'Sun, 29 Nov 2026 10:00:00 GMT'],
    ['epoch seconds', '1795946400'],
    ['a bare number', '100'],
    ['a fractional duration', '1.5h'],
    ['a negative duration', '-1h'],
    ['an upper-case unit', '1H'],
    ['weeks', '1w'],
    ['a compound duration', '1h30m'],
    ['a duration with a space', '1 h'],
    ['a unit alone', 'h'],
    ['an ISO-8601 duration', 'PT1H'],
    ['a word', 'yesterday'],
    ['an empty value', ''],
    ['a value over 64 characters', `2026-11-29T10:00:00Z${' '.repeat(50)}`],
  ])('since as %s (%j)', (_name, since) => {
    const err = rejects({ since }, 'since')
    expect(err.detail).toMatch(/^since must be /)
  })

  it.each(['2026-11-29T10:00:00', 'yesterday', '1w', ''])('until=%j', (until) => {
    const err = rejects({ until }, 'until')
    expect(err.detail).toMatch(/^until must be /)
  })

  it('checks unknown parameters before the values of known ones', () => {
    rejects('limit=0&foo=1', 'foo')
  })
})

describe('regressions: values the database would refuse are a 400, not a 503', () => {
  it.each([
    [{ cursor: '9223372036854775808' }, 'cursor'],
    [{ since: '2026-02-30T10:00:00Z' }, 'since'],
    [{ until: '2026-13-01T10:00:00Z' }, 'until'],
    [{ since: '10000000d' }, 'since'],
    [{ since: '99999999999999999999d' }, 'since'],
  ])('%j', (query, parameter) => {
    rejects(query, parameter)
  })
})
