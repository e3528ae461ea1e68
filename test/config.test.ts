import { describe, expect, it } from 'vitest'
import { loadConfigText } from '../src/config/load.js'
import { ConfigError, idempotencyWaitOf, parseConfig } from '../src/config/schema.js'
import { parseDuration, parseSize } from '../src/config/units.js'

type Raw = Record<string, unknown>

/** A minimal valid route; overrides replace or (with undefined) remove fields. */
function route(overrides: Raw = {}): Raw {
  const r: Raw = {
    name: 'capture',
    method: 'POST',
    path: '/payments/:invoice_id/capture',
    upstream: 'http://127.0.0.1:9001',
    entity: 'invoice:{params.invoice_id}',
    ...overrides,
  }
  for (const k of Object.keys(r)) if (r[k] === undefined) delete r[k]
  return r
}

/** Runs `f`, requires a ConfigError and returns its problems. */
function problemsOf(f: () => unknown): string[] {
  try {
    f()
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError)
    const problems = (err as ConfigError).problems
    expect(problems.length).toBeGreaterThan(0)
    // The message lists every problem, so a crash log shows them all.
    for (const p of problems) expect((err as ConfigError).message).toContain(p)
    return problems
  }
  throw new Error('expected a ConfigError, but the configuration was accepted')
}

/** Asserts that some problem is about exactly `field` (and mentions `fragment`, when given). */
function expectProblem(problems: string[], field: string, fragment?: string | RegExp): void {
  const about = problems.filter((p) => p.startsWith(`${field}: `))
  expect(about, `no problem names ${field}; got ${JSON.stringify(problems)}`).not.toHaveLength(0)
  if (fragment !== undefined) {
    const matches = about.some((p) => (typeof fragment === 'string' ? p.includes(fragment) : fragment.test(p)))
    expect(matches, `no problem about ${field} mentions ${String(fragment)}; got ${JSON.stringify(about)}`).toBe(true)
  }
}

const routeYaml = (extra = ''): string => [
  'routes:',
  '  - name: capture',
  '    method: POST',
  '    path: /payments/:invoice_id/capture',
  '    upstream: http://127.0.0.1:9001',
  '    entity: "invoice:{params.invoice_id}"',
  extra,
].join('\n')

describe('parseConfig defaults', () => {
  it('fills in every default around a minimal route', () => {
    const config = parseConfig({ routes: [route()] })
    expect(config.server).toEqual({
      host: '127.0.0.1',
      port: 8080,
      admin_host: '127.0.0.1',
      admin_port: 8081,
      max_request_body: 1024 * 1024,
      max_header_bytes: 16 * 1024,
      lingering_time: 30_000,
      lingering_timeout: 5_000,
      workers: 1,
      allowed_hosts: [],
      headers_timeout: 10_000,
      request_timeout: 60_000,
      max_connections: 1024,
      max_connections_per_peer: 256,
      drain_delay: 5_000,
    })
    expect(config.auth).toEqual({ mode: 'none', tenant_claim: 'tenant_id', clock_tolerance: 5000 })
    expect(config.store).toEqual({ data_dir: '.fencegate', connect_timeout: 1000, pooler: 'none', max_connections: 20, require_replicated: false, purge_interval: 60_000 })
    expect(config.store.url).toBeUndefined()
    expect(config.log).toEqual({ level: 'info' })
    expect(config.routes).toHaveLength(1)
    const r = config.routes[0]!
    expect(r.fence).toBe('required')
    expect(r.timeout_ms).toBe(10_000)
    expect(r.upstream).toEqual({ origin: 'http://127.0.0.1:9001', basePath: '' })
    expect(r).toMatchObject({
      idempotency: 'off', idempotency_ttl: 86_400_000, idempotency_lock: 30_000, on_unknown_outcome: 'fail',
      transient_statuses: [429, 503], max_stored_body: 1024 * 1024, scopes: [], forward_authorization: false, upstream_headers: {}, attest: false,
      upstream_dedupes_keys: false, upstream_key: 'as_sent', replay_headers: [], error_envelope: 'stripe',
    })
    expect(r.retry_hint_header).toBeUndefined()
    expect(r.idempotency_wait).toBeUndefined()
    expect(idempotencyWaitOf(r)).toBe(10_000)
  })

  it('lets a duplicate wait as long as its original may run: idempotency_wait defaults to timeout_ms, at most 60s', () => {
    const wait = (extra: Record<string, unknown>) => idempotencyWaitOf(parseConfig({ routes: [route(extra)] }).routes[0]!)
    expect(wait({ timeout_ms: 4000 })).toBe(4000)
    expect(wait({ timeout_ms: 120_000 })).toBe(60_000)
    expect(wait({ timeout_ms: 4000, idempotency_wait: 0 })).toBe(0)
  })

  it('refuses replay_headers that must never come from the store, and lower-cases the rest', () => {
    for (const name of ['Set-Cookie', 'Content-Length', 'Transfer-Encoding', 'Idempotent-Replayed', 'X-Request-Id']) {
      expect(problemsOf(() => parseConfig({ routes: [route({ replay_headers: [name] })] }))).toEqual([expect.stringMatching(/^routes\[0\]\.replay_headers\[0\]: this header is never replayed/)])
    }
    expect(parseConfig({ routes: [route({ replay_headers: ['Request-Id', 'Stripe-Version'] })] }).routes[0]!.replay_headers).toEqual(['request-id', 'stripe-version'])
    expect(problemsOf(() => parseConfig({ routes: [route({ retry_hint_header: 'Stripe Should Retry' })] }))).toEqual([expect.stringMatching(/retry_hint_header: expected a header name/)])
  })

  it('takes an error_envelope of stripe, square, adyen or resend, and names the field for another', () => {
    for (const envelope of ['stripe', 'square', 'adyen', 'resend']) expect(parseConfig({ routes: [route({ error_envelope: envelope })] }).routes[0]!.error_envelope).toBe(envelope)
    expect(problemsOf(() => parseConfig({ routes: [route({ error_envelope: 'paypal' })] }))).toEqual([expect.stringMatching(/^routes\[0\]\.error_envelope: /)])
  })

  it('checks upstream_tls against its route: https only, a certificate with its key, reject_unauthorized: false only on loopback', () => {
    const tlsRoute = (upstream: string, upstream_tls: Record<string, unknown>) => route({ upstream, upstream_tls })
    const problems = (r: Record<string, unknown>) => problemsOf(() => parseConfig({ routes: [r] }))
    expect(parseConfig({ routes: [tlsRoute('https://psp.example.com', { ca_file: 'ca.pem', cert_file: 'c.pem', key_file: 'k.pem', servername: 'api.psp.example.com' })] }).routes[0]!.upstream_tls)
      .toEqual({ ca_file: 'ca.pem', cert_file: 'c.pem', key_file: 'k.pem', servername: 'api.psp.example.com', reject_unauthorized: true })
    expect(problems(tlsRoute('http://psp.example.com', { ca_file: 'ca.pem' }))).toEqual(['routes[0].upstream_tls: needs an https upstream'])
    expect(problems(tlsRoute('https://psp.example.com', { cert_file: 'c.pem' }))).toEqual([expect.stringMatching(/^routes\[0\]\.upstream_tls\.key_file: required with cert_file/)])
    expect(problems(tlsRoute('https://psp.example.com', { key_file: 'k.pem' }))).toEqual([expect.stringMatching(/^routes\[0\]\.upstream_tls\.cert_file: required with key_file/)])
    expect(problems(tlsRoute('https://psp.example.com', { reject_unauthorized: false }))).toEqual([expect.stringMatching(/^routes\[0\]\.upstream_tls\.reject_unauthorized: false is allowed only for an upstream on loopback/)])
    for (const host of ['127.0.0.1:8443', 'localhost:8443', '[::1]:8443', '127.9.9.9']) {
      expect(parseConfig({ routes: [tlsRoute(`https://${host}`, { reject_unauthorized: false })] }).routes[0]!.upstream_tls!.reject_unauthorized).toBe(false)
    }
    expect(problems(tlsRoute('https://psp.example.com', { servername: 'not a name' }))).toEqual([expect.stringMatching(/^routes\[0\]\.upstream_tls\.servername: expected a DNS name/)])
    expect(problems(tlsRoute('https://psp.example.com', { cafile: 'ca.pem' }))).toEqual([expect.stringMatching(/^routes\[0\]\.upstream_tls: .*cafile/)])
  })

  it('fills in defaults inside a partially given section', () => {
    const config = parseConfig({ server: { port: 9000 }, store: { url: 'postgres://u@h/db' }, routes: [route()] })
    expect(config.server).toEqual({ host: '127.0.0.1', port: 9000, admin_host: '127.0.0.1', admin_port: 8081, max_request_body: 1048576, max_header_bytes: 16384, lingering_time: 30_000, lingering_timeout: 5_000, workers: 1, allowed_hosts: [], headers_timeout: 10_000, request_timeout: 60_000, max_connections: 1024, max_connections_per_peer: 256, drain_delay: 5_000 })
    expect(config.store).toEqual({ url: 'postgres://u@h/db', data_dir: '.fencegate', connect_timeout: 1000, pooler: 'none', max_connections: 20, require_replicated: false, purge_interval: 60_000 })
  })

  it('accepts the fencegate.example.yaml shape', () => {
    const config = parseConfig({
      server: { port: 8080, admin_port: 8081, admin_host: '127.0.0.1' },
      store: { data_dir: '.fencegate' },
      routes: [
        route({ name: 'capture-payment', timeout_ms: 10000, fence: 'required' }),
        route({ name: 'create-ticket', path: '/tickets', entity: 'ticket:{body.ticket.external_id}', fence: 'optional' }),
        route({ name: 'get-invoice', method: 'GET', path: '/invoices/:invoice_id', entity: undefined, fence: 'off' }),
      ],
    })
    expect(config.routes.map((r) => [r.name, r.method, r.fence])).toEqual([
      ['capture-payment', 'POST', 'required'],
      ['create-ticket', 'POST', 'optional'],
      ['get-invoice', 'GET', 'off'],
    ])
    expect(config.routes[2]!.entity).toBeUndefined()
  })
})

describe('parseConfig normalisation of valid values', () => {
  it.each([
    [8080, 8080],
    ['8080', 8080],
    [0, 0],
    [65535, 65535],
  ])('port %j → %j', (input, expected) => {
    expect(parseConfig({ server: { port: input, admin_port: input }, routes: [route()] }).server).toMatchObject({ port: expected, admin_port: expected })
  })

  it.each([
    [65536, 65536],
    ['1MiB', 1048576],
    ['512kb', 512000],
    ['64 KiB', 65536],
    ['1', 1],
  ])('max_request_body %j → %j bytes', (input, expected) => {
    expect(parseConfig({ server: { max_request_body: input }, routes: [route()] }).server.max_request_body).toBe(expected)
  })

  it.each(['get', 'Post', 'PUT', 'patch', 'DELETE'])('method %s is upper-cased', (method) => {
    expect(parseConfig({ routes: [route({ method })] }).routes[0]!.method).toBe(method.toUpperCase())
  })

  it.each([
    ['http://127.0.0.1:9001', 'http://127.0.0.1:9001', ''],
    ['http://127.0.0.1:9001/', 'http://127.0.0.1:9001', ''],
    ['https://api.example.com/v1/', 'https://api.example.com', '/v1'],
    ['https://api.example.com:443/a/b//', 'https://api.example.com', '/a/b'],
    ['HTTP://Example.COM:80/x', 'http://example.com', '/x'],
  ])('upstream %s → origin %s, basePath %j', (upstream, origin, basePath) => {
    expect(parseConfig({ routes: [route({ upstream })] }).routes[0]!.upstream).toEqual({ origin, basePath })
  })

  it.each(['required', 'optional', 'off'] as const)('fence %s is kept', (fence) => {
    expect(parseConfig({ routes: [route({ fence })] }).routes[0]!.fence).toBe(fence)
  })

  it('fence off needs no entity', () => {
    expect(parseConfig({ routes: [route({ fence: 'off', entity: undefined })] }).routes[0]!.entity).toBeUndefined()
  })

  it.each([1, 600_000])('timeout_ms %d is accepted', (timeout_ms) => {
    expect(parseConfig({ routes: [route({ timeout_ms })] }).routes[0]!.timeout_ms).toBe(timeout_ms)
  })

  it.each(['debug', 'info', 'warn', 'error', 'silent'])('log level %s is accepted', (level) => {
    expect(parseConfig({ log: { level }, routes: [route()] }).log.level).toBe(level)
  })

  it.each(['postgres://u:p@h:5432/db', 'postgresql://h/db'])('store.url %s is accepted', (url) => {
    expect(parseConfig({ store: { url }, routes: [route()] }).store.url).toBe(url)
  })

  it('an empty store.url counts as absent', () => {
    expect(parseConfig({ store: { url: '' }, routes: [route()] }).store.url).toBeUndefined()
  })

  it('entity templates from every source are accepted', () => {
    const config = parseConfig({
      routes: [
        route({ name: 'p', entity: 'invoice:{params.invoice_id}' }),
        route({ name: 'q', path: '/q', entity: 'acct:{query.account}' }),
        route({ name: 'h', path: '/h', entity: 'tenant:{header.X-Tenant}' }),
        route({ name: 'b', path: '/b', entity: 'ticket:{body.ticket.external_id}' }),
        route({ name: 'm', path: '/m/:a', entity: '{params.a}/{query.b}/{header.c}/{body.d}' }),
      ],
    })
    expect(config.routes).toHaveLength(5)
  })

  it('routes whose paths differ only in a literal segment, or in method, do not clash', () => {
    const config = parseConfig({
      routes: [
        route({ name: 'a', path: '/payments/:id/capture', entity: 'x:{params.id}' }),
        route({ name: 'b', path: '/payments/:id/refund', entity: 'x:{params.id}' }),
        route({ name: 'c', method: 'PUT', path: '/payments/:id/capture', entity: 'x:{params.id}' }),
        route({ name: 'd', path: '/payments/special/capture', entity: 'x:{query.id}' }),
      ],
    })
    expect(config.routes.map((r) => r.name)).toEqual(['a', 'b', 'c', 'd'])
  })

  it('route names may be 64 characters of letters, digits, _ . -', () => {
    const name = `A${'b_.-9'.repeat(12)}xyz`
    expect(name).toHaveLength(64)
    expect(parseConfig({ routes: [route({ name })] }).routes[0]!.name).toBe(name)
  })
})

describe('parseConfig rejects invalid values, naming the field', () => {
  const cases: [string, Raw, string, (string | RegExp)?][] = [
    // server
    ['port too large', { server: { port: 70000 } }, 'server.port'],
    ['negative port', { server: { port: -1 } }, 'server.port'],
    ['fractional port', { server: { port: 80.5 } }, 'server.port'],
    ['non-numeric port', { server: { port: 'http' } }, 'server.port', 'port number'],
    ['negative port string', { server: { port: '-1' } }, 'server.port'],
    ['admin_port too large', { server: { admin_port: 65536 } }, 'server.admin_port'],
    ['boolean admin_port', { server: { admin_port: true } }, 'server.admin_port'],
    ['empty host', { server: { host: '' } }, 'server.host'],
    ['empty admin_host', { server: { admin_host: '' } }, 'server.admin_host'],
    ['zero body size', { server: { max_request_body: 0 } }, 'server.max_request_body', 'expected a size'],
    ['zero body size string', { server: { max_request_body: '0MiB' } }, 'server.max_request_body'],
    ['fractional size', { server: { max_request_body: '1.5MiB' } }, 'server.max_request_body', '"1.5MiB"'],
    ['unknown size unit', { server: { max_request_body: '1TiB' } }, 'server.max_request_body'],
    ['negative size', { server: { max_request_body: -1 } }, 'server.max_request_body'],
    ['headers_timeout below 100ms', { server: { headers_timeout: '50ms' } }, 'server.headers_timeout', 'at least 100ms'],
    ['headers_timeout not a duration', { server: { headers_timeout: 'soon' } }, 'server.headers_timeout', 'expected a duration'],
    ['headers_timeout past request_timeout', { server: { headers_timeout: '30s', request_timeout: '20s', lingering_time: '1s' } }, 'server.headers_timeout', 'at most server.request_timeout'],
    ['request_timeout over an hour', { server: { request_timeout: '2h' } }, 'server.request_timeout', 'at most 1h'],
    ['request_timeout shorter than the linger', { server: { request_timeout: '20s' } }, 'server.request_timeout', 'lingering_time'],
    ['zero max_connections', { server: { max_connections: 0 } }, 'server.max_connections'],
    ['zero max_connections_per_peer', { server: { max_connections_per_peer: 0 } }, 'server.max_connections_per_peer'],
    ['per-peer cap over the total', { server: { max_connections: 100 } }, 'server.max_connections_per_peer', 'at most server.max_connections'],
    ['drain_delay not a duration', { server: { drain_delay: 'a while' } }, 'server.drain_delay', 'expected a duration'],
    ['drain_delay over 5m', { server: { drain_delay: '10m' } }, 'server.drain_delay', 'at most 5m'],
    ['empty size', { server: { max_request_body: '' } }, 'server.max_request_body'],
    ['boolean size', { server: { max_request_body: true } }, 'server.max_request_body'],
    ['server not an object', { server: 'localhost' }, 'server'],
    ['server null', { server: null }, 'server'],
    // store
    ['mysql store url', { store: { url: 'mysql://h/db' } }, 'store.url', 'postgres://'],
    ['store url without scheme', { store: { url: 'localhost:5432' } }, 'store.url'],
    ['empty data_dir', { store: { data_dir: '' } }, 'store.data_dir'],
    ['connect_timeout under 100ms', { store: { connect_timeout: '50ms' } }, 'store.connect_timeout', 'at least 100ms'],
    ['connect_timeout over 60s', { store: { connect_timeout: '2m' } }, 'store.connect_timeout', 'at most 60s'],
    ['purge_interval under 1s', { store: { purge_interval: '500ms' } }, 'store.purge_interval', 'at least 1s'],
    ['purge_interval over 1h', { store: { purge_interval: '2h' } }, 'store.purge_interval', 'at most 1h'],
    ['unknown pooler mode', { store: { pooler: 'session' } }, 'store.pooler'],
    ['no connections', { store: { max_connections: 0 } }, 'store.max_connections'],
    ['too many connections', { store: { max_connections: 101 } }, 'store.max_connections'],
    // log
    ['unknown log level', { log: { level: 'verbose' } }, 'log.level'],
    // telemetry
    ['telemetry.entity not a boolean', { telemetry: { entity: 'no' } }, 'telemetry.entity'],
    ['an exporter in the file (OTEL_* only)', { telemetry: { exporter: 'otlp' } }, 'telemetry', 'exporter'],
    // unknown keys at every level
    ['unknown top-level key', { listen: 8080 }, '(root)', 'listen'],
    ['unknown server key', { server: { portt: 8080 } }, 'server', 'portt'],
    ['unknown store key', { store: { uri: 'postgres://h/db' } }, 'store', 'uri'],
    ['unknown log key', { log: { format: 'json' } }, 'log', 'format'],
    // routes
    ['routes missing', { routes: undefined }, 'routes'],
    ['routes empty', { routes: [] }, 'routes', 'at least one route'],
    ['routes not a list', { routes: { capture: route() } }, 'routes'],
  ]
  it.each(cases)('%s', (_name, input, field, fragment) => {
    const config: Raw = { routes: [route()], ...input }
    if (config.routes === undefined) delete config.routes
    expectProblem(problemsOf(() => parseConfig(config)), field, fragment)
  })

  const routeCases: [string, Raw, string, (string | RegExp)?][] = [
    ['unknown route key', { retries: 3 }, 'routes[0]', 'retries'],
    ['misspelt route key', { timeout: 5000 }, 'routes[0]', 'timeout'],
    ['missing name', { name: undefined }, 'routes[0].name'],
    ['empty name', { name: '' }, 'routes[0].name'],
    ['name with a space', { name: 'capture payment' }, 'routes[0].name'],
    ['name starting with -', { name: '-capture' }, 'routes[0].name'],
    ['name with a slash', { name: 'a/b' }, 'routes[0].name'],
    ['65-character name', { name: 'a'.repeat(65) }, 'routes[0].name'],
    ['HEAD method', { method: 'HEAD' }, 'routes[0].method'],
    ['OPTIONS method', { method: 'OPTIONS' }, 'routes[0].method'],
    ['CONNECT method', { method: 'CONNECT' }, 'routes[0].method'],
    ['made-up method', { method: 'FETCH' }, 'routes[0].method'],
    ['missing method', { method: undefined }, 'routes[0].method'],
    ['numeric method', { method: 1 }, 'routes[0].method'],
    ['ftp upstream', { upstream: 'ftp://127.0.0.1:21' }, 'routes[0].upstream', 'http(s) URL'],
    ['file upstream', { upstream: 'file:///etc/passwd' }, 'routes[0].upstream'],
    ['upstream with user and password', { upstream: 'http://user:secret@127.0.0.1:9001' }, 'routes[0].upstream', 'credentials'],
    ['upstream with user only', { upstream: 'http://user@127.0.0.1:9001' }, 'routes[0].upstream'],
    ['upstream with query', { upstream: 'http://127.0.0.1:9001/api?key=1' }, 'routes[0].upstream', 'query'],
    ['upstream with fragment', { upstream: 'http://127.0.0.1:9001/#x' }, 'routes[0].upstream'],
    ['relative upstream', { upstream: '/api' }, 'routes[0].upstream'],
    ['not a URL', { upstream: 'not a url' }, 'routes[0].upstream', 'not a url'],
    ['missing upstream', { upstream: undefined }, 'routes[0].upstream'],
    ['path without leading /', { path: 'payments/:invoice_id/capture' }, 'routes[0].path', 'must start with /'],
    ['empty path', { path: '' }, 'routes[0].path'],
    ['path with ?', { path: '/payments/:invoice_id/capture?x=1' }, 'routes[0].path', '? # or %'],
    ['path with #', { path: '/payments/:invoice_id/capture#x' }, 'routes[0].path'],
    ['path with %', { path: '/payments/:invoice_id/cap%20ture' }, 'routes[0].path'],
    ['empty parameter name', { path: '/payments/:/capture', entity: 'x:{query.a}' }, 'routes[0].path', 'bad parameter name'],
    ['parameter name starting with a digit', { path: '/payments/:1d/capture', entity: 'x:{query.a}' }, 'routes[0].path'],
    ['parameter name with -', { path: '/payments/:invoice-id/capture', entity: 'x:{query.a}' }, 'routes[0].path'],
    ['repeated parameter', { path: '/a/:id/b/:id', entity: 'x:{params.id}' }, 'routes[0].path', 'twice'],
    ['reserved prefix', { path: '/_fencegate/health', entity: 'x:{query.a}' }, 'routes[0].path', '/_fencegate/ is reserved'],
    ['reserved prefix with a param', { path: '/_fencegate/:x', entity: 'x:{params.x}' }, 'routes[0].path', 'reserved'],
    ['reserved prefix itself', { path: '/_fencegate', entity: 'x:{query.a}' }, 'routes[0].path', 'reserved'],
    ['reserved prefix with a slash', { path: '/_fencegate/', entity: 'x:{query.a}' }, 'routes[0].path', 'reserved'],
    ['entity with an unknown source', { entity: 'invoice:{cookie.id}' }, 'routes[0].entity', 'unknown source "cookie"'],
    ['entity with a path source', { entity: 'invoice:{path.invoice_id}' }, 'routes[0].entity', 'unknown source'],
    ['entity without a placeholder', { entity: 'invoice' }, 'routes[0].entity', 'at least one {placeholder}'],
    ['entity placeholder without a name', { entity: 'invoice:{params}' }, 'routes[0].entity', '{source.name}'],
    ['entity placeholder with an empty name', { entity: 'invoice:{params.}' }, 'routes[0].entity'],
    ['entity placeholder with an empty body key', { entity: 'invoice:{body.a..b}' }, 'routes[0].entity'],
    ['empty entity placeholder', { entity: 'invoice:{}' }, 'routes[0].entity'],
    ['dotted params name', { entity: 'invoice:{params.invoice_id.x}' }, 'routes[0].entity', 'one name'],
    ['dotted header name', { entity: 'invoice:{header.a.b}' }, 'routes[0].entity', 'one name'],
    ['unbalanced {', { entity: 'invoice:{params.invoice_id' }, 'routes[0].entity', 'unbalanced'],
    ['unbalanced }', { entity: 'invoice}:{params.invoice_id}' }, 'routes[0].entity', 'unbalanced'],
    ['entity param not in the path', { entity: 'invoice:{params.id}' }, 'routes[0].entity', 'params.id'],
    ['entity not a string', { entity: 42 }, 'routes[0].entity'],
    ['unknown fence mode', { fence: 'maybe' }, 'routes[0].fence'],
    ['fence true', { fence: true }, 'routes[0].fence'],
    ['fence required without entity', { fence: 'required', entity: undefined }, 'routes[0].entity', 'required when fence is required'],
    ['fence defaulting to required without entity', { entity: undefined }, 'routes[0].entity', 'required when fence is required'],
    ['fence optional without entity', { fence: 'optional', entity: undefined }, 'routes[0].entity', 'required when fence is optional'],
    ['zero timeout', { timeout_ms: 0 }, 'routes[0].timeout_ms'],
    ['negative timeout', { timeout_ms: -5 }, 'routes[0].timeout_ms'],
    ['timeout over 10 minutes', { timeout_ms: 600_001 }, 'routes[0].timeout_ms'],
    ['fractional timeout', { timeout_ms: 1.5 }, 'routes[0].timeout_ms'],
    ['timeout with a unit', { timeout_ms: '5s' }, 'routes[0].timeout_ms'],
  ]
  it.each(routeCases)('route: %s', (_name, overrides, field, fragment) => {
    expectProblem(problemsOf(() => parseConfig({ routes: [route(overrides)] })), field, fragment)
  })

  it('names the index of the bad route', () => {
    const problems = problemsOf(() => parseConfig({ routes: [route({ name: 'a' }), route({ name: 'b', path: '/b', fence: 'sometimes' })] }))
    expectProblem(problems, 'routes[1].fence')
    expect(problems.some((p) => p.startsWith('routes[0]'))).toBe(false)
  })

  it('rejects duplicate route names, naming the later one', () => {
    const problems = problemsOf(() => parseConfig({ routes: [route(), route({ path: '/other/:invoice_id' })] }))
    expectProblem(problems, 'routes[1].name', 'duplicate route name capture')
  })

  it('rejects two routes with the same method and path shape', () => {
    const problems = problemsOf(() => parseConfig({
      routes: [
        route({ name: 'a', path: '/payments/:invoice_id/capture' }),
        route({ name: 'b', path: '/payments/:id/capture', entity: 'x:{params.id}' }),
      ],
    }))
    expectProblem(problems, 'routes[1].path', 'another route already matches POST /payments/:id/capture')
  })

  it('compares methods after upper-casing them when looking for clashes', () => {
    const problems = problemsOf(() => parseConfig({ routes: [route({ name: 'a', method: 'post' }), route({ name: 'b', method: 'POST' })] }))
    expectProblem(problems, 'routes[1].path', 'another route already matches')
  })

  it('rejects identical literal paths', () => {
    const problems = problemsOf(() => parseConfig({
      routes: [route({ name: 'a', path: '/tickets', entity: 'x:{body.id}' }), route({ name: 'b', path: '/tickets', entity: 'x:{body.id}' })],
    }))
    expectProblem(problems, 'routes[1].path')
  })

  it('reports every bad field at once', () => {
    const problems = problemsOf(() => parseConfig({
      server: { port: 'x', max_request_body: 'lots' },
      log: { level: 'loud' },
      routes: [route({ method: 'HEAD', upstream: 'ftp://h' })],
      extra: true,
    }))
    for (const field of ['server.port', 'server.max_request_body', 'log.level', 'routes[0].method', 'routes[0].upstream', '(root)']) {
      expectProblem(problems, field)
    }
  })

  it.each([null, undefined, {}])('a missing or empty document (%j) fails on routes', (input) => {
    expectProblem(problemsOf(() => parseConfig(input)), 'routes')
  })

  it.each([[[]], ['routes'], [42]])('a non-mapping document (%j) is rejected', (input) => {
    problemsOf(() => parseConfig(input))
  })
})

describe('loadConfigText', () => {
  it('parses YAML into the same config as parseConfig', () => {
    const config = loadConfigText(`server:\n  port: 9090\n${routeYaml('    fence: optional')}`, {})
    expect(config.server.port).toBe(9090)
    expect(config.routes[0]).toMatchObject({ name: 'capture', method: 'POST', fence: 'optional', entity: 'invoice:{params.invoice_id}' })
  })

  it('prefixes every problem with the source name', () => {
    const problems = problemsOf(() => loadConfigText('server:\n  port: x\nroutes: []\n', {}, 'fencegate.yaml'))
    expect(problems).toHaveLength(2)
    for (const p of problems) expect(p.startsWith('fencegate.yaml: ')).toBe(true)
    expect(problems).toContainEqual(expect.stringMatching(/^fencegate\.yaml: server\.port: /))
    expect(problems).toContainEqual(expect.stringMatching(/^fencegate\.yaml: routes: /))
  })

  it('defaults the source name to "config"', () => {
    expect(problemsOf(() => loadConfigText('routes: []', {}))[0]).toMatch(/^config: routes: /)
  })

  it.each([
    ['unclosed flow mapping', 'server: { port: 1'],
    ['bad indentation', 'server:\n  port: 1\n bad: 2'],
    ['tab indentation', 'server:\n\tport: 1'],
  ])('rejects invalid YAML (%s)', (_name, text) => {
    const problems = problemsOf(() => loadConfigText(text, {}, 'f.yaml'))
    expect(problems).toHaveLength(1)
    expect(problems[0]).toMatch(/^f\.yaml: not valid YAML: /)
  })

  it('rejects an empty document for lack of routes', () => {
    expect(problemsOf(() => loadConfigText('', {}))).toEqual(['config: routes: Invalid input: expected array, received undefined'])
  })
})

describe('${VAR} expansion', () => {
  it('expands a variable inside a flow mapping', () => {
    const config = loadConfigText(`store: { url: \${DATABASE_URL}, data_dir: .fencegate }\n${routeYaml()}`, {
      DATABASE_URL: 'postgres://user:p%40ss@db:5432/fencegate?sslmode=require',
    })
    expect(config.store).toEqual({ url: 'postgres://user:p%40ss@db:5432/fencegate?sslmode=require', data_dir: '.fencegate', connect_timeout: 1000, pooler: 'none', max_connections: 20, require_replicated: false, purge_interval: 60_000 })
  })

  it('expands a value containing "," and "}" inside a flow mapping without breaking it', () => {
    const config = loadConfigText(`store: { url: \${DATABASE_URL}, data_dir: \${DIR} }\n${routeYaml()}`, {
      DATABASE_URL: 'postgres://h/db?options=a,b}',
      DIR: '/var/lib/fg, x',
    })
    expect(config.store).toEqual({ url: 'postgres://h/db?options=a,b}', data_dir: '/var/lib/fg, x', connect_timeout: 1000, pooler: 'none', max_connections: 20, require_replicated: false, purge_interval: 60_000 })
  })

  it('expands a variable inside a longer string', () => {
    const text = routeYaml().replace('http://127.0.0.1:9001', 'http://${UP_HOST}:${UP_PORT}/api/${VERSION}')
    const config = loadConfigText(text, { UP_HOST: 'payments.internal', UP_PORT: '9443', VERSION: 'v2' })
    expect(config.routes[0]!.upstream).toEqual({ origin: 'http://payments.internal:9443', basePath: '/api/v2' })
  })

  it('expands variables in quoted scalars, in lists and in numeric-looking fields', () => {
    const text = `server:\n  host: "\${HOST}"\n  port: \${PORT}\n  max_request_body: \${BODY}\n${routeYaml().replace('name: capture', 'name: ${NAME}')}`
    const config = loadConfigText(text, { HOST: '0.0.0.0', PORT: '8443', BODY: '2MiB', NAME: 'capture-v2' })
    expect(config.server).toMatchObject({ host: '0.0.0.0', port: 8443, max_request_body: 2 * 1024 * 1024 })
    expect(config.routes[0]!.name).toBe('capture-v2')
  })

  it('uses ${VAR:-default} when the variable is unset', () => {
    const config = loadConfigText(`server:\n  port: \${PORT:-8088}\n  host: \${HOST:-0.0.0.0}\n${routeYaml()}`, {})
    expect(config.server).toMatchObject({ port: 8088, host: '0.0.0.0' })
  })

  it('prefers the variable over the default when it is set', () => {
    const config = loadConfigText(`server:\n  port: \${PORT:-8088}\n${routeYaml()}`, { PORT: '7000' })
    expect(config.server.port).toBe(7000)
  })

  it('allows a default that contains : / and -', () => {
    const config = loadConfigText(`store:\n  url: \${DATABASE_URL:-postgres://localhost:5432/fg-dev}\n${routeYaml()}`, {})
    expect(config.store.url).toBe('postgres://localhost:5432/fg-dev')
  })

  it('${VAR:-} gives an empty store.url, which counts as absent', () => {
    const config = loadConfigText(`store:\n  url: \${DATABASE_URL:-}\n${routeYaml()}`, {})
    expect(config.store.url).toBeUndefined()
    expect(config.store.data_dir).toBe('.fencegate')
  })

  it('${VAR:-} inside a flow mapping also leaves store.url absent', () => {
    const config = loadConfigText(`store: { url: \${DATABASE_URL:-}, data_dir: .fencegate }\n${routeYaml()}`, {})
    expect(config.store).toEqual({ data_dir: '.fencegate', connect_timeout: 1000, pooler: 'none', max_connections: 20, require_replicated: false, purge_interval: 60_000 })
  })

  it('an unset ${VAR} is an error naming the variable and the field', () => {
    const problems = problemsOf(() => loadConfigText(`store: { url: \${DATABASE_URL} }\n${routeYaml()}`, {}, 'fencegate.yaml'))
    expect(problems).toHaveLength(1)
    expect(problems[0]).toMatch(/^fencegate\.yaml: store\.url: environment variable DATABASE_URL is not set/)
    expect(problems[0]).toContain('${DATABASE_URL:-}')
  })

  it('names the field of an unset variable inside a route list', () => {
    const text = routeYaml().replace('http://127.0.0.1:9001', 'http://${UPSTREAM_HOST}:9001')
    const problems = problemsOf(() => loadConfigText(text, {}))
    expect(problems).toEqual([expect.stringMatching(/^config: routes\[0\]\.upstream: environment variable UPSTREAM_HOST is not set/)])
  })

  it('an unset variable is an error even next to a set one', () => {
    const problems = problemsOf(() => loadConfigText(`server:\n  host: \${A}\${B}\n${routeYaml()}`, { A: 'x' }))
    expect(problems[0]).toContain('environment variable B is not set')
  })

  it('a variable set to an empty string is used as the empty string', () => {
    const config = loadConfigText(`store:\n  url: \${DATABASE_URL}\n${routeYaml()}`, { DATABASE_URL: '' })
    expect(config.store.url).toBeUndefined()
  })

  it.each([
    ['a mapping and a list item', 'a: b\n- c'],
    ['a nested mapping', 'x\nport: 1'],
    ['flow syntax', '{ port: 1 }, [2]'],
    ['a comment', 'x # not a comment'],
    ['quotes', `"it's" 'quoted'`],
    ['an anchor, alias and tag', '&a *a !!int 5'],
    ['a document marker', '---\nrouters: []'],
    ['leading and trailing spaces', '  padded  '],
  ])('a value containing YAML syntax (%s) cannot inject structure', (_name, value) => {
    const config = loadConfigText(`server: { host: \${HOST}, admin_host: 127.0.0.1 }\nauth: { tenant_claim: "\${HOST}" }\nstore:\n  data_dir: \${HOST}\n${routeYaml()}`, { HOST: value })
    expect(config.server.host).toBe(value)
    expect(config.auth.tenant_claim).toBe(value)
    expect(config.store.data_dir).toBe(value)
    expect(Object.keys(config)).toEqual(['server', 'auth', 'store', 'log', 'telemetry', 'routes', 'entity_rules', 'job_types', 'job_retention', 'job_waiting_claims', 'audit', 'fence_history'])
    expect(Object.keys(config.server)).toEqual(['host', 'port', 'admin_host', 'admin_port', 'max_request_body', 'max_header_bytes', 'lingering_time', 'lingering_timeout', 'workers', 'allowed_hosts', 'headers_timeout', 'request_timeout', 'max_connections', 'max_connections_per_peer', 'drain_delay'])
    expect(config.server.port).toBe(8080)
    expect(config.routes).toHaveLength(1)
  })

  it('a value that looks like a number or boolean stays a string where a string is expected', () => {
    const config = loadConfigText(`server:\n  host: \${HOST}\nstore:\n  data_dir: \${DIR}\n${routeYaml()}`, { HOST: '1234', DIR: 'true' })
    expect(config.server.host).toBe('1234')
    expect(config.store.data_dir).toBe('true')
  })

  it('an injected value is validated like any other', () => {
    const problems = problemsOf(() => loadConfigText(`server:\n  port: \${PORT}\n${routeYaml()}`, { PORT: '8080\nadmin_port: 1' }))
    expect(problems).toEqual([expect.stringMatching(/^config: server\.port: /)])
  })

  it('leaves $VAR without braces and malformed references alone', () => {
    const config = loadConfigText(`server:\n  host: $HOST\nstore:\n  data_dir: "\${1X}/\${}"\n${routeYaml()}`, { HOST: 'nope' })
    expect(config.server.host).toBe('$HOST')
    expect(config.store.data_dir).toBe('${1X}/${}')
  })

  it('ignores references inside YAML comments', () => {
    const config = loadConfigText(`# store.url defaults to \${DATABASE_URL}\n${routeYaml()}  # \${ALSO_UNSET}`, {})
    expect(config.store.url).toBeUndefined()
  })

  it('expands the same variable twice', () => {
    const config = loadConfigText(`server:\n  host: \${H}\n  admin_host: \${H}\n${routeYaml()}`, { H: '127.0.0.1' })
    expect(config.server).toMatchObject({ host: '127.0.0.1', admin_host: '127.0.0.1' })
  })
})

describe('parseSize', () => {
  it.each<[string | number, number]>([
    ['0', 0],
    ['1', 1],
    ['1048576', 1048576],
    ['10b', 10],
    ['10B', 10],
    ['1kb', 1000],
    ['512kb', 512_000],
    ['1KiB', 1024],
    ['1kib', 1024],
    ['1MB', 1_000_000],
    ['1MiB', 1_048_576],
    ['1mib', 1_048_576],
    ['1 MiB', 1_048_576],
    ['  64KiB  ', 65_536],
    ['2GB', 2_000_000_000],
    ['2GiB', 2 * 1024 ** 3],
    [0, 0],
    [65536, 65536],
    [Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER],
  ])('parseSize(%j) = %d', (input, expected) => {
    expect(parseSize(input)).toBe(expected)
  })

  it.each<[string | number]>([
    [''], [' '], ['MiB'], ['1.5MiB'], ['-1'], ['+1'], ['1e3'], ['0x10'], ['1TiB'], ['1TB'], ['1 M'], ['1k'],
    ['1 Mi B'], ['1MiB2'], ['one'], [-1], [1.5], [Number.NaN], [Number.POSITIVE_INFINITY], [Number.MAX_SAFE_INTEGER + 1],
  ])('parseSize(%j) is undefined', (input) => {
    expect(parseSize(input)).toBeUndefined()
  })
})

describe('parseDuration', () => {
  it.each<[string | number, number]>([
    ['0', 0],
    ['250', 250],
    ['250ms', 250],
    ['30s', 30_000],
    ['15m', 900_000],
    ['1h', 3_600_000],
    ['7d', 604_800_000],
    [' 5 s ', 5_000],
    [0, 0],
    [1500, 1500],
  ])('parseDuration(%j) = %d', (input, expected) => {
    expect(parseDuration(input)).toBe(expected)
  })

  it.each<[string | number]>([
    [''], ['h'], ['1.5h'], ['-1s'], ['+1s'], ['1H'], ['1MS'], ['1w'], ['1y'], ['1hr'], ['1h30m'], ['1e3'], ['one'],
    [-1], [1.5], [Number.NaN], [Number.POSITIVE_INFINITY],
  ])('parseDuration(%j) is undefined', (input) => {
    expect(parseDuration(input)).toBeUndefined()
  })
})

describe('regressions', () => {
  it('timeout_ms can come from an environment variable', () => {
    expect(loadConfigText(routeYaml('    timeout_ms: ${T}'), { T: '5000' }).routes[0]!.timeout_ms).toBe(5000)
  })
  it('a size past the safe-integer range is rejected, not rounded', () => {
    expect(parseSize('99999999999999999999')).toBeUndefined()
    expect(parseSize('99999999999999999999999GiB')).toBeUndefined()
  })
  it('an entity template error is reported once, under entity', () => {
    expect(problemsOf(() => parseConfig({ routes: [route({ entity: 'x:{cookie.id}' })] }))).toHaveLength(1)
    expect(problemsOf(() => parseConfig({ routes: [route({ path: 'no-slash/:id' })] })).filter((p) => p.includes('entity'))).toEqual([])
  })
  it('a ${VAR} used as a key is expanded, never leaking its placeholder', () => {
    expect(problemsOf(() => loadConfigText(`\${K}: 1\n${routeYaml()}`, { K: 'listen' })).join()).not.toMatch(/fgvar/)
  })
  it('${VAR:-default} uses the default when VAR is set but empty, as a shell does', () => {
    expect(loadConfigText(`server: { port: \${PORT:-9000} }\n${routeYaml()}`, { PORT: '' }).server.port).toBe(9000)
  })
})

describe('idempotency and auth options', () => {
  it('a route whose timeout_ms is at least its idempotency_lock is refused only when idempotency is on', () => {
    expect(parseConfig({ routes: [route({ timeout_ms: 600_000 })] }).routes[0]!.timeout_ms).toBe(600_000)
    expect(problemsOf(() => parseConfig({ routes: [route({ timeout_ms: 30_000, idempotency: 'required' })] }))).toEqual([expect.stringMatching(/^routes\[0\]\.idempotency_lock: must exceed timeout_ms/)])
  })
  it('without auth the admin plane stays on loopback and routes cannot ask for scopes or tenant claims', () => {
    expect(problemsOf(() => parseConfig({ server: { admin_host: '0.0.0.0' }, routes: [route()] }))).toEqual([expect.stringMatching(/^server\.admin_host: /)])
    expect(problemsOf(() => parseConfig({ routes: [route({ scopes: ['a'] })] }))).toEqual([expect.stringMatching(/^routes\[0\]\.scopes: /)])
    expect(problemsOf(() => parseConfig({ routes: [route({ claimed_tenant: 'body.tenant' })] }))).toEqual([expect.stringMatching(/^routes\[0\]\.claimed_tenant: /)])
    const jwt = { mode: 'jwt', issuer: 'https://i', audience: 'a', hs256_secret: 'x'.repeat(32) }
    expect(parseConfig({ auth: jwt, server: { admin_host: '0.0.0.0' }, routes: [route({ scopes: ['a'], claimed_tenant: 'header.X-Tenant-Id' })] }).routes[0]!.scopes).toEqual(['a'])
  })
  it('parses durations and refuses bad ones, naming the field', () => {
    const r = parseConfig({ routes: [route({ idempotency: 'required', idempotency_ttl: '1h', idempotency_lock: '45s', idempotency_wait: 500 })] }).routes[0]!
    expect([r.idempotency_ttl, r.idempotency_lock, r.idempotency_wait]).toEqual([3_600_000, 45_000, 500])
    expect(problemsOf(() => parseConfig({ routes: [route({ idempotency_ttl: 'forever' })] }))).toEqual([expect.stringMatching(/^routes\[0\]\.idempotency_ttl: /)])
  })
})

describe('job types and lease-bound routes', () => {
  it('applies job type defaults and refuses bad or duplicate types', () => {
    const c = parseConfig({ routes: [route()], job_types: [{ name: 'customer_health_report', lease: '45s' }] })
    expect(c.job_types[0]).toEqual({ name: 'customer_health_report', lease: 45_000, max_attempts: 5, backoff: 10_000, max_runtime: 1_800_000 })
    expect(problemsOf(() => parseConfig({ routes: [route()], job_types: [{ name: 'a', lease: '45s' }, { name: 'a', lease: '1m' }] }))).toEqual([expect.stringMatching(/^job_types\[1\]\.name: duplicate/)])
    expect(problemsOf(() => parseConfig({ routes: [route()], job_types: [{ name: 'a', lease: '10m', max_runtime: '1m' }] }))).toEqual([expect.stringMatching(/^job_types\[0\]\.max_runtime: /)])
    expect(problemsOf(() => parseConfig({ routes: [route()], job_types: [{ name: 'a', lease: '100ms' }] }))).toEqual([expect.stringMatching(/^job_types\[0\]\.lease: /)])
  })
  it('caps waiting claims per tenant at job_waiting_claims (default 100), and refuses a cap that is not a positive integer', () => {
    expect(parseConfig({ routes: [route()] }).job_waiting_claims).toBe(100)
    expect(parseConfig({ routes: [route()], job_waiting_claims: '300' }).job_waiting_claims).toBe(300)
    for (const bad of [0, -1, 1.5, 'many', 100_001]) {
      expect(problemsOf(() => parseConfig({ routes: [route()], job_waiting_claims: bad }))).toEqual([expect.stringMatching(/^job_waiting_claims: /)])
    }
  })
  it('fence: lease needs an entity of the form job:{...}', () => {
    expect(parseConfig({ routes: [route({ fence: 'lease', entity: 'job:{header.X-Job-Id}' })] }).routes[0]!.fence).toBe('lease')
    expect(problemsOf(() => parseConfig({ routes: [route({ fence: 'lease' })] }))).toEqual([expect.stringMatching(/^routes\[0\]\.entity: fence: lease needs/)])
  })
})
