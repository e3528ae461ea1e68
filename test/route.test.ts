import { describe, expect, it } from 'vitest'
import { parseConfig, type RouteConfig } from '../src/config/schema.js'
import { readBodyFields } from '../src/http/body-fields.js'
import { FencegateError } from '../src/http/problems.js'
import {
  compileEntityTemplate, compilePathPattern, compileRoute, createRouter, maxEntityLength, reservedPrefix, resolveEntity,
  type EntitySources,
} from '../src/gateway/route.js'

/** Runs `f`, requires a FencegateError and returns it. */
function caught(f: () => unknown): FencegateError {
  try {
    f()
  } catch (err) {
    expect(err).toBeInstanceOf(FencegateError)
    return err as FencegateError
  }
  throw new Error('expected a FencegateError, but nothing was thrown')
}

/** Validated routes, built through the real schema. */
function routes(...raw: Record<string, unknown>[]): RouteConfig[] {
  return parseConfig({ routes: raw.map((r) => ({ upstream: 'http://127.0.0.1:9001', ...r })) }).routes
}

function sources(s: { params?: Record<string, string>; query?: string; headers?: Record<string, string>; body?: string } = {}): EntitySources & { jsonCalls: () => number } {
  let calls = 0
  return {
    params: s.params ?? {},
    query: new URLSearchParams(s.query ?? ''),
    headers: new Headers(s.headers ?? {}),
    body() {
      calls++
      return readBodyFields(new Headers(), new TextEncoder().encode(s.body ?? ''))
    },
    jsonCalls: () => calls,
  }
}

describe('compilePathPattern', () => {
  it('splits a hono-style path into literals and params', () => {
    expect(compilePathPattern('/payments/:invoice_id/capture')).toEqual({
      segments: [{ literal: 'payments' }, { param: 'invoice_id' }, { literal: 'capture' }],
      params: ['invoice_id'],
    })
  })

  it('keeps params in order', () => {
    expect(compilePathPattern('/t/:tenant/u/:user_id/:_x9').params).toEqual(['tenant', 'user_id', '_x9'])
  })

  it.each([
    ['/', [{ literal: '' }]],
    ['/tickets', [{ literal: 'tickets' }]],
    ['/tickets/', [{ literal: 'tickets' }, { literal: '' }]],
    ['/a//b', [{ literal: 'a' }, { literal: '' }, { literal: 'b' }]],
    ['/v1.2/x-y_z~', [{ literal: 'v1.2' }, { literal: 'x-y_z~' }]],
    ['/:id', [{ param: 'id' }]],
  ])('%s → %j', (path, segments) => {
    expect(compilePathPattern(path).segments).toEqual(segments)
  })

  it.each([
    ['', 'must start with /'],
    ['payments', 'must start with /'],
    ['*', 'must start with /'],
    ['/a?b', '? # or %'],
    ['/a#b', '? # or %'],
    ['/a%20b', '? # or %'],
    ['/a/:', 'bad parameter name'],
    ['/a/:1st', 'bad parameter name'],
    ['/a/:invoice-id', 'bad parameter name'],
    ['/a/:id.json', 'bad parameter name'],
    ['/a/::id', 'bad parameter name'],
    ['/a/:id/b/:id', 'twice'],
  ])('%j is rejected (%s)', (path, message) => {
    expect(() => compilePathPattern(path)).toThrow(message)
  })

  it('reserves /_fencegate/', () => {
    expect(reservedPrefix).toBe('/_fencegate/')
  })
})

describe('compileEntityTemplate', () => {
  it('compiles a params placeholder', () => {
    expect(compileEntityTemplate('invoice:{params.invoice_id}')).toEqual({
      parts: [{ literal: 'invoice:' }, { source: 'params', name: 'invoice_id' }],
      usesBody: false,
      params: ['invoice_id'],
      kind: 'entity',
      escape: undefined,
    })
  })

  it('compiles a query placeholder', () => {
    expect(compileEntityTemplate('acct:{query.account}')).toEqual({
      parts: [{ literal: 'acct:' }, { source: 'query', name: 'account' }],
      usesBody: false,
      params: [],
      kind: 'entity',
      escape: undefined,
    })
  })

  it('compiles a header placeholder with its name lower-cased', () => {
    expect(compileEntityTemplate('{header.X-Tenant-Id}').parts).toEqual([{ source: 'header', name: 'x-tenant-id' }])
  })

  it('keeps query and params names case-sensitive', () => {
    expect(compileEntityTemplate('{query.Account}/{params.Id}').parts).toEqual([
      { source: 'query', name: 'Account' },
      { literal: '/' },
      { source: 'params', name: 'Id' },
    ])
  })

  it('compiles a nested body path', () => {
    expect(compileEntityTemplate('ticket:{body.ticket.external_id}')).toEqual({
      parts: [{ literal: 'ticket:' }, { source: 'body', path: ['ticket', 'external_id'] }],
      usesBody: true,
      params: [],
      kind: 'entity',
      escape: undefined,
    })
  })

  it('compiles a body path with an array index', () => {
    expect(compileEntityTemplate('{body.items.0.id}').parts).toEqual([{ source: 'body', path: ['items', '0', 'id'] }])
  })

  it('mixes literals and every source', () => {
    const t = compileEntityTemplate('t/{params.a}:{query.b}-{header.C}.{body.d.e}!')
    expect(t.parts).toEqual([
      { literal: 't/' },
      { source: 'params', name: 'a' },
      { literal: ':' },
      { source: 'query', name: 'b' },
      { literal: '-' },
      { source: 'header', name: 'c' },
      { literal: '.' },
      { source: 'body', path: ['d', 'e'] },
      { literal: '!' },
    ])
    expect(t.usesBody).toBe(true)
    expect(t.params).toEqual(['a'])
  })

  it('lists every params placeholder', () => {
    expect(compileEntityTemplate('{params.a}:{params.b}:{params.a}').params).toEqual(['a', 'b', 'a'])
  })

  it.each([
    ['invoice', 'at least one {placeholder}'],
    ['', 'at least one {placeholder}'],
    ['{}', '{source.name}'],
    ['{params}', '{source.name}'],
    ['{params.}', '{source.name}'],
    ['{.id}', 'unknown source'],
    ['{body}', '{source.name}'],
    ['{body.a..b}', '{source.name}'],
    ['{body.a.}', '{source.name}'],
    ['{params.a.b}', 'params takes one name'],
    ['{query.a.b}', 'query takes one name'],
    ['{header.a.b}', 'header takes one name'],
    ['{cookie.session}', 'unknown source "cookie"'],
    ['{Params.id}', 'unknown source "Params"'],
    ['{path.id}', 'unknown source'],
    ['x:{params.id', 'unbalanced'],
    ['x:params.id}', 'unbalanced'],
    ['{params.a}}', 'unbalanced'],
    ['{{params.a}}', 'unbalanced'],
  ])('%j is rejected (%s)', (template, message) => {
    expect(() => compileEntityTemplate(template)).toThrow(message)
  })
})

describe('compileRoute', () => {
  it('compiles the path and the entity of a route', () => {
    const [config] = routes({ name: 'capture', method: 'POST', path: '/payments/:invoice_id/capture', entity: 'invoice:{params.invoice_id}' })
    const route = compileRoute(config!)
    expect(route.config).toBe(config)
    expect(route.pattern.params).toEqual(['invoice_id'])
    expect(route.entity?.params).toEqual(['invoice_id'])
  })

  it('leaves entity undefined for a route without one', () => {
    const [config] = routes({ name: 'read', method: 'GET', path: '/x', fence: 'off' })
    expect(compileRoute(config!).entity).toBeUndefined()
  })

  it('rejects an entity that uses a param the path does not define', () => {
    const [config] = routes({ name: 'capture', method: 'POST', path: '/payments/:invoice_id', entity: 'x:{query.a}' })
    expect(() => compileRoute({ ...config!, entity: 'invoice:{params.id}' })).toThrow('route capture: entity uses params.id, which /payments/:invoice_id does not define')
  })
})

describe('createRouter', () => {
  const router = createRouter(routes(
    { name: 'capture', method: 'POST', path: '/payments/:invoice_id/capture', entity: 'invoice:{params.invoice_id}' },
    { name: 'get-invoice', method: 'GET', path: '/invoices/:invoice_id', fence: 'off' },
    { name: 'tickets', method: 'POST', path: '/tickets', entity: 'ticket:{body.id}' },
    { name: 'two', method: 'PUT', path: '/a/:x/b/:y', entity: '{params.x}/{params.y}' },
    { name: 'root', method: 'DELETE', path: '/', fence: 'off' },
  ))
  const nameOf = (method: string, path: string) => router.match(method, path)?.route.config.name

  it('compiles every route', () => {
    expect(router.routes.map((r) => r.config.name)).toEqual(['capture', 'get-invoice', 'tickets', 'two', 'root'])
  })

  it('matches a route and returns its params', () => {
    const match = router.match('POST', '/payments/42/capture')
    expect(match?.route.config.name).toBe('capture')
    expect(match?.params).toEqual({ invoice_id: '42' })
  })

  it('matches several params', () => {
    expect(router.match('PUT', '/a/1/b/2')?.params).toEqual({ x: '1', y: '2' })
  })

  it('matches literal-only routes with no params', () => {
    expect(router.match('POST', '/tickets')?.params).toEqual({})
    expect(nameOf('DELETE', '/')).toBe('root')
  })

  it.each([
    ['inv%2042', 'inv 42'],
    ['a%2Fb', 'a/b'],
    ['%C3%A9t%C3%A9', 'été'],
    ['%F0%9F%90%88', '🐈'],
    ['a+b', 'a+b'],
    ['%25', '%'],
    ['%3A%3F%23', ':?#'],
    ['INV-0001', 'INV-0001'],
  ])('percent-decodes the param %s → %j', (raw, decoded) => {
    expect(router.match('POST', `/payments/${raw}/capture`)?.params).toEqual({ invoice_id: decoded })
  })

  it.each([
    ['an extra segment', '/payments/42/capture/again'],
    ['a trailing slash', '/payments/42/capture/'],
    ['a missing segment', '/payments/42'],
    ['a missing param', '/payments/capture'],
    ['an empty param segment', '/payments//capture'],
    ['a different literal', '/payments/42/refund'],
    ['a literal in another case', '/Payments/42/capture'],
    ['a percent-encoded literal', '/payments/42/c%61pture'],
    ['a doubled leading slash', '//payments/42/capture'],
    ['the empty path', ''],
  ])('does not match with %s', (_name, path) => {
    expect(router.match('POST', path)).toBeUndefined()
  })

  it('never matches an empty segment as a param, wherever it is', () => {
    expect(router.match('PUT', '/a//b/2')).toBeUndefined()
    expect(router.match('PUT', '/a/1/b/')).toBeUndefined()
    expect(router.match('GET', '/invoices/')).toBeUndefined()
  })

  it('requires the method to match', () => {
    expect(nameOf('GET', '/payments/42/capture')).toBeUndefined()
    expect(nameOf('PUT', '/payments/42/capture')).toBeUndefined()
    expect(nameOf('HEAD', '/invoices/1')).toBeUndefined()
    expect(nameOf('POST', '/invoices/1')).toBeUndefined()
    expect(nameOf('GET', '/invoices/1')).toBe('get-invoice')
  })

  it.each(['%', '%E0%A4%A', '%ZZ', 'ok%', '%C3', '%ED%A0%80'])('rejects the bad percent-encoding %j with invalid_request', (raw) => {
    const err = caught(() => router.match('POST', `/payments/${raw}/capture`))
    expect(err.code).toBe('invalid_request')
    expect(err.status).toBe(400)
    expect(err.detail).toContain('segment 2')
  })

  it('does not decode literal segments, so bad encoding there simply does not match', () => {
    expect(router.match('POST', '/payments%ZZ/42/capture')).toBeUndefined()
  })

  it('returns a fresh params object per match', () => {
    const a = router.match('POST', '/payments/1/capture')!
    const b = router.match('POST', '/payments/2/capture')!
    expect(a.params).toEqual({ invoice_id: '1' })
    expect(b.params).toEqual({ invoice_id: '2' })
  })

  it('prefers the more specific route when a literal route and a param route both match, whatever their order', () => {
    for (const order of [['special', 'any'], ['any', 'special']]) {
      const defs = {
        special: { name: 'special', method: 'POST', path: '/payments/special/capture', entity: 'x:{query.id}' },
        any: { name: 'any', method: 'POST', path: '/payments/:invoice_id/capture', entity: 'x:{params.invoice_id}' },
      } as const
      const r = createRouter(routes(...order.map((n) => defs[n as keyof typeof defs])))
      expect(r.match('POST', '/payments/special/capture')?.route.config.name).toBe('special')
      expect(r.match('POST', '/payments/other/capture')?.route.config.name).toBe('any')
    }
    // Left to right: the first position where one has a literal and the other a parameter decides.
    const r = createRouter(routes(
      { name: 'a', method: 'POST', path: '/a/:x/c', entity: 'x:{params.x}' },
      { name: 'b', method: 'POST', path: '/a/b/:y', entity: 'x:{params.y}' },
    ))
    expect(r.match('POST', '/a/b/c')?.route.config.name).toBe('b')
  })

  it('an empty router matches nothing', () => {
    expect(createRouter([]).match('GET', '/')).toBeUndefined()
  })

  it('refuses a route whose entity uses an undefined param', () => {
    const [config] = routes({ name: 'c', method: 'POST', path: '/c/:id', entity: 'x:{params.id}' })
    expect(() => createRouter([{ ...config!, entity: 'x:{params.other}' }])).toThrow('params.other')
  })
})

describe('resolveEntity', () => {
  const resolve = (template: string, s: Parameters<typeof sources>[0]) => resolveEntity(compileEntityTemplate(template), sources(s))
  const unresolved = (template: string, s: Parameters<typeof sources>[0]) => {
    const err = caught(() => resolve(template, s))
    expect(err.code).toBe('entity_unresolved')
    expect(err.status).toBe(400)
    return err
  }

  it('reads params', () => {
    expect(resolve('invoice:{params.invoice_id}', { params: { invoice_id: '42' } })).toBe('invoice:42')
  })

  it('refuses a query parameter it reads that is given twice: the gateway read the first, an upstream may read the last', () => {
    expect(() => resolve('acct:{query.account}', { query: 'account=a%201&account=a2' })).toThrow(/more than once/)
    expect(resolve('acct:{query.account}', { query: 'account=a1&other=1&other=2' })).toBe('acct:a1')
  })

  it('reads headers case-insensitively', () => {
    expect(resolve('tenant:{header.X-Tenant}', { headers: { 'x-tenant': 'acme' } })).toBe('tenant:acme')
    expect(resolve('tenant:{header.x-tenant}', { headers: { 'X-TENANT': 'acme' } })).toBe('tenant:acme')
  })

  it('reads a nested body value', () => {
    expect(resolve('ticket:{body.ticket.external_id}', { body: '{"ticket":{"external_id":"T-1","other":2}}' })).toBe('ticket:T-1')
  })

  it('reads a body value through an array index', () => {
    expect(resolve('item:{body.items.1.id}', { body: '{"items":[{"id":"i0"},{"id":"i1"}]}' })).toBe('item:i1')
  })

  it('reads a body key that is not an identifier', () => {
    expect(resolve('{body.a-b}/{body.0}', { body: '{"a-b":"x","0":"y"}' })).toBe('x/y')
  })

  it('concatenates every source with the literals', () => {
    expect(resolve('t/{params.a}:{query.b}-{header.c}.{body.d}!', {
      params: { a: '1' }, query: 'b=2', headers: { c: '3' }, body: '{"d":"4"}',
    })).toBe('t/1:2-3.4!')
  })

  it.each([
    ['42', '42'],
    ['0', '0'],
    ['-7', '-7'],
    ['9007199254740991', '9007199254740991'],
  ])('accepts the JSON number %s as %j', (json, expected) => {
    expect(resolve('n:{body.n}', { body: `{"n":${json}}` })).toBe(`n:${expected}`)
  })

  it.each([
    ['an object', '{"id":{"x":"1"}}'],
    ['an array', '{"id":["1"]}'],
    ['an empty array', '{"id":[]}'],
    ['true', '{"id":true}'],
    ['false', '{"id":false}'],
    ['an infinite number', '{"id":1e400}'],
    ['a fraction', '{"id":1.5}'],
    ['an integer written as a fraction (an upstream may read 42.0)', '{"id":42.0}'],
    ['an integer written with an exponent', '{"id":1e3}'],
    ['minus zero', '{"id":-0}'],
    ['null (an upstream may take it for absent or for a value)', '{"id":null}'],
    ['an integer beyond 2^53 (two ids would collide)', '{"id":12345678901234567890}'],
  ])('refuses body.id as unreadable when it is %s, never reading it as absent', (_name, body) => {
    const err = caught(() => resolve('t:{body.id}', { body }))
    expect([err.code, err.status]).toEqual(['unreadable_body', 400])
    expect(err.detail).toContain('body.id')
  })

  it('refuses a body that is not JSON (nor declared a form) as unreadable', () => {
    expect(caught(() => resolve('t:{body.id}', { body: 'id=1' })).code).toBe('unreadable_body')
  })

  it.each([
    ['an empty string', '{"id":""}'],
    ['a missing key', '{"other":"1"}'],
    ['an absent body', undefined],
    ['a JSON string body', '"1"'],
    ['a JSON array body', '["1"]'],
    ['a JSON null body', 'null'],
  ])('leaves body.id unresolved when it is %s', (_name, body) => {
    const err = unresolved('t:{body.id}', body === undefined ? {} : { body })
    expect(err.extras).toEqual({ source: 'body.id' })
    expect(err.detail).toBe('body.id is missing from the request')
  })

  it('reports the full body path when an intermediate node is missing or not an object', () => {
    expect(unresolved('{body.a.b.c}', { body: '{"a":{"b":"str"}}' }).extras).toEqual({ source: 'body.a.b.c' })
    expect(unresolved('{body.a.b.c}', { body: '{"a":null}' }).extras).toEqual({ source: 'body.a.b.c' })
    expect(unresolved('{body.a.b.c}', { body: '{"a":[]}' }).extras).toEqual({ source: 'body.a.b.c' })
    expect(unresolved('{body.a.b.c}', { body: '{}' }).extras).toEqual({ source: 'body.a.b.c' })
  })

  it('does not read inherited properties from the body', () => {
    for (const path of ['constructor', '__proto__', 'toString', 'hasOwnProperty']) {
      expect(unresolved(`{body.${path}}`, { body: '{}' }).extras).toEqual({ source: `body.${path}` })
    }
  })

  it('reads an own "__proto__" key like any other', () => {
    expect(resolve('{body.__proto__}', { body: '{"__proto__":"p"}' })).toBe('p')
  })

  it('does not follow an array index past the end', () => {
    expect(unresolved('{body.items.2}', { body: '{"items":["a","b"]}' }).extras).toEqual({ source: 'body.items.2' })
  })

  it.each([
    ['a missing param', '{params.id}', {}, 'params.id'],
    ['an empty param', '{params.id}', { params: { id: '' } }, 'params.id'],
    ['a missing query parameter', '{query.account}', { query: 'other=1' }, 'query.account'],
    ['an empty query parameter', '{query.account}', { query: 'account=' }, 'query.account'],
    ['a valueless query parameter', '{query.account}', { query: 'account' }, 'query.account'],
    ['a missing header', '{header.X-Tenant}', {}, 'header.x-tenant'],
    ['an empty header', '{header.X-Tenant}', { headers: { 'x-tenant': '' } }, 'header.x-tenant'],
  ])('reports %s with a source extra', (_name, template, s, source) => {
    const err = unresolved(template, s)
    expect(err.extras).toEqual({ source })
    expect(err.detail).toBe(`${source} is missing from the request`)
  })

  it('reports the first unresolved placeholder', () => {
    expect(unresolved('{query.a}:{params.b}', {}).extras).toEqual({ source: 'query.a' })
    expect(unresolved('{query.a}:{params.b}', { query: 'a=1' }).extras).toEqual({ source: 'params.b' })
  })

  it(`accepts an entity of exactly ${maxEntityLength} characters and refuses a longer one`, () => {
    expect(maxEntityLength).toBe(512)
    const prefix = 'invoice:'
    const fits = 'x'.repeat(maxEntityLength - prefix.length)
    expect(resolve('invoice:{params.id}', { params: { id: fits } })).toHaveLength(512)
    const err = unresolved('invoice:{params.id}', { params: { id: `${fits}x` } })
    expect(err.detail).toContain('512')
  })

  it('counts the length of body values too', () => {
    unresolved('{body.id}', { body: JSON.stringify({ id: 'y'.repeat(513) }) })
    expect(resolve('{body.id}', { body: JSON.stringify({ id: 'y'.repeat(512) }) })).toHaveLength(512)
  })

  it('parses the body only for templates that use it', () => {
    const s = sources({ params: { id: '1' }, body: '{"id":"2"}' })
    expect(resolveEntity(compileEntityTemplate('{params.id}'), s)).toBe('1')
    expect(s.jsonCalls()).toBe(0)
    expect(resolveEntity(compileEntityTemplate('{body.id}'), s)).toBe('2')
    expect(s.jsonCalls()).toBeGreaterThan(0)
  })

  it('stops before reading the body when an earlier placeholder is missing', () => {
    const s = sources({ body: '{"id":"2"}' })
    caught(() => resolveEntity(compileEntityTemplate('{query.a}:{body.id}'), s))
    expect(s.jsonCalls()).toBe(0)
  })
})

describe('regressions: entities the store could not hold as given', () => {
  it.each([
    ['NUL (PostgreSQL refused it: 503 instead of 400)', 'a\u0000b'],
    ['a control character', 'a\u0007b'],
    ['U+FFFD from invalid UTF-8 (two inputs would share one fence)', 'a\ufffd'],
    ['a lone surrogate', 'a\ud800'],
  ])('%s is entity_unresolved', (_name, value) => {
    expect(() => resolveEntity(compileEntityTemplate('x:{params.id}'), {
      params: { id: value }, query: new URLSearchParams(), headers: new Headers(), body: () => ({ at: () => undefined }),
    })).toThrow(expect.objectContaining({ code: 'entity_unresolved' }))
  })
})
