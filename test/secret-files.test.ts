import { rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { until } from './helpers/claim-gateway.js'
import { issuer, audience, token } from './helpers/tokens.js'
import { stringify } from 'yaml'
import { loadConfigFile, loadConfigText } from '../src/config/load.js'
import { ConfigError } from '../src/config/schema.js'
import { postgresBinaries, startCluster, type Cluster } from './helpers/cluster.js'
import { post, route } from './helpers/gateway.js'
import { runCli, startGatewayProcess, tempDir, type GatewayProcess } from './helpers/process.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * `${file:/path}` beside `${VAR}` (docs/configuration.md#secrets-from-files): secrets mounted as
 * files by Kubernetes, Docker or systemd's LoadCredential=, read at start and on SIGHUP, one
 * trailing newline dropped, never logged; a file that cannot be read fails the start naming the
 * field, and on SIGHUP keeps the secrets in use and logs the field.
 */
const dir = tempDir('fencegate-secrets-')
function secret(name: string, content: string): string {
  const file = join(dir, name)
  writeFileSync(file, content, { mode: 0o600 })
  return file
}

function configFile(doc: Record<string, unknown>): string {
  const file = join(tempDir('fencegate-secret-config-'), 'fencegate.yaml')
  writeFileSync(file, stringify(doc))
  return file
}

const upstreamRoute = (headers: Record<string, string>) => route('http://127.0.0.1:9', { upstream_headers: headers })

function problemsOf(load: () => unknown): string[] {
  try {
    load()
  } catch (err) {
    if (err instanceof ConfigError) return err.problems
    throw err
  }
  throw new Error('expected a ConfigError')
}

describe('${file:…} in the configuration', () => {
  it('reads the file, dropping one trailing \\n or \\r\\n and nothing else', () => {
    const lf = secret('lf', 'sk_live_LF\n')
    const crlf = secret('crlf', 'sk_live_CRLF\r\n')
    const two = secret('two', 'kept\n\n')
    const none = secret('none', 'bare')
    const config = loadConfigFile(configFile({ store: { data_dir: `\${file:${two}}` }, routes: [upstreamRoute({ A: `Bearer \${file:${lf}}`, B: `\${file:${crlf}}`, D: `\${file:${none}}` })] }), {})
    expect(config.routes[0]!.upstream_headers).toEqual({ A: 'Bearer sk_live_LF', B: 'sk_live_CRLF', D: 'bare' })
    expect(config.store.data_dir).toBe('kept\n')
  })

  it('stands wherever ${VAR} does: store.url, auth secrets, and a path that starts with a variable', () => {
    const url = secret('database_url', 'postgres://fencegate:pw@db.internal:5432/fencegate\n')
    const hs = secret('hs256', `${'s'.repeat(40)}\n`)
    const config = loadConfigFile(configFile({
      store: { url: `\${file:\${CREDENTIALS_DIRECTORY}/database_url}` },
      auth: { mode: 'jwt', issuer: 'https://issuer.example', audience: 'fencegate', hs256_secret: `\${file:${hs}}` },
      routes: [upstreamRoute({})],
    }), { CREDENTIALS_DIRECTORY: dir })
    expect(url).toContain('database_url')
    expect([config.store.url, config.auth.hs256_secret]).toEqual(['postgres://fencegate:pw@db.internal:5432/fencegate', 's'.repeat(40)])
  })

  it('keeps a file\'s YAML-looking content a plain string', () => {
    const tricky = secret('tricky', 'a: b\n- [c]\n')
    const config = loadConfigFile(configFile({ store: { data_dir: `\${file:${tricky}}` }, routes: [upstreamRoute({})] }), {})
    expect(config.store.data_dir).toBe('a: b\n- [c]')
  })

  it('fails naming the field and the path, never a content, when a file is missing or its path variable unset', () => {
    const file = configFile({ routes: [upstreamRoute({ Authorization: `Bearer \${file:${join(dir, 'absent')}}` })] })
    expect(problemsOf(() => loadConfigFile(file, {}))).toEqual([`${file}: routes[0].upstream_headers.Authorization: cannot read file ${join(dir, 'absent')} (ENOENT)`])
    const unset = configFile({ store: { url: '${file:${CREDENTIALS_DIRECTORY}/database_url}' }, routes: [upstreamRoute({})] })
    expect(problemsOf(() => loadConfigFile(unset, {}))[0]).toContain('store.url: environment variable CREDENTIALS_DIRECTORY')
  })

  it('is an error, naming the field, where no file system is given (the Workers binding)', () => {
    const text = stringify({ store: { url: '${file:/run/secrets/database_url}' }, routes: [upstreamRoute({})] })
    expect(problemsOf(() => loadConfigText(text, {}, 'FENCEGATE_CONFIG'))[0]).toMatch(/^FENCEGATE_CONFIG: store\.url: \$\{file:\/run\/secrets\/database_url\} cannot be read here/)
  })
})

describe('fencegate serve with secret files', () => {
  let upstream: TestUpstream | undefined
  let gw: GatewayProcess | undefined
  afterAll(async () => {
    await gw?.stop()
    await upstream?.close()
  })

  it('exits 2 naming the field when a secret file is missing', async () => {
    const file = configFile({ routes: [route('http://127.0.0.1:9', { upstream_headers: { Authorization: `Bearer \${file:${join(dir, 'missing-token')}}` } })] })
    const res = await runCli(['serve', '--config', file, '--data-dir', tempDir('fencegate-secret-store-')])
    expect(res.code).toBe(2)
    expect(res.stderr).toContain(`routes[0].upstream_headers.Authorization: cannot read file ${join(dir, 'missing-token')} (ENOENT)`)
  })

  it('sends the file\'s secret to the upstream and never logs it', async () => {
    const token = 'sk_live_FROM_A_FILE_0451'
    let seen: string | undefined
    upstream = await startUpstream((req, res) => {
      seen = String(req.headers.authorization)
      res.end('{}')
    })
    const file = configFile({
      server: { port: 0, admin_port: 0, drain_delay: 0 }, log: { level: 'debug' },
      routes: [route(upstream.url, { upstream_headers: { Authorization: `Bearer \${file:${secret('token', `${token}\n`)}}` } })],
    })
    gw = await startGatewayProcess(['--config', file, '--data-dir', tempDir('fencegate-secret-store-')])
    expect((await post(`${gw.dataUrl}/payments/1/capture`, '1')).status).toBe(200)
    expect(seen).toBe(`Bearer ${token}`)
    await gw.stop()
    expect(gw.lines.join('\n')).not.toContain(token)
  })
})

describe('fencegate serve on SIGHUP', () => {
  let upstream: TestUpstream | undefined
  let gw: GatewayProcess | undefined
  afterAll(async () => {
    await gw?.stop()
    await upstream?.close()
  })

  /** The log lines of `event` so far. */
  const logged = (event: string) => gw!.lines.map((l) => JSON.parse(l) as Record<string, string>).filter((l) => l.event === event)
  /** SIGHUP, then the first new line of `event`. */
  async function hangUp(event: string): Promise<Record<string, string>> {
    const before = logged(event).length
    gw!.child.kill('SIGHUP')
    await until(`a ${event} line`, () => logged(event).length > before)
    return logged(event)[before]!
  }

  it('reads the secret files again: a rotated upstream key and HS256 secret are used at once; an unreadable file keeps both and names the field', async () => {
    const seen: string[] = []
    upstream = await startUpstream((req, res) => {
      seen.push(String(req.headers['x-api-key']))
      res.end('{}')
    })
    const apiKey = secret('hup-api-key', 'key_ONE_7c1\n')
    const signing = secret('hup-hs256', `${'1'.repeat(40)}\n`)
    const level = secret('hup-level', 'info\n')
    const file = configFile({
      server: { port: 0, admin_port: 0, drain_delay: 0 }, log: { level: `\${file:${level}}` },
      auth: { mode: 'jwt', issuer, audience, hs256_secret: `\${file:${signing}}` },
      routes: [route(upstream.url, { upstream_headers: { 'X-Api-Key': `\${file:${apiKey}}` } })],
    })
    gw = await startGatewayProcess(['--config', file, '--data-dir', tempDir('fencegate-secret-store-')])
    const signedWith = async (key: string) => ({ authorization: `Bearer ${await token({}, { key: new TextEncoder().encode(key) })}` })
    const capture = async (key: string, fence: string) => (await post(`${gw!.dataUrl}/payments/1/capture`, fence, { headers: await signedWith(key) })).status
    expect(await capture('1'.repeat(40), '1')).toBe(200)

    writeFileSync(apiKey, 'key_TWO_9d4\n')
    writeFileSync(signing, `${'2'.repeat(40)}\n`)
    writeFileSync(level, 'debug\n')
    const reloaded = await hangUp('secrets_reloaded')
    expect(reloaded.changed).toBe('auth,routes.upstream_headers')
    // The log level is set at start; the line names the field, not its value.
    expect(logged('config_reload_needs_restart').map((l) => l.fields)).toEqual(['log.level'])
    expect([await capture('1'.repeat(40), '2'), await capture('2'.repeat(40), '3')]).toEqual([401, 200])

    rmSync(apiKey)
    const failed = await hangUp('config_reload_failed')
    expect(failed.problems).toBe(`${file}: routes[0].upstream_headers.X-Api-Key: cannot read file ${apiKey} (ENOENT)`)
    expect(await capture('2'.repeat(40), '4')).toBe(200)
    expect(seen).toEqual(['key_ONE_7c1', 'key_TWO_9d4', 'key_TWO_9d4'])
    await gw.stop()
    for (const value of ['key_ONE_7c1', 'key_TWO_9d4', '1'.repeat(40), '2'.repeat(40)]) expect(gw.lines.join('\n')).not.toContain(value)
  }, 120_000)
})

const bin = postgresBinaries()

describe.skipIf(!bin)('fencegate serve --workers 2 on SIGHUP', () => {
  let cluster: Cluster
  let upstream: TestUpstream | undefined
  let gw: GatewayProcess | undefined
  afterAll(async () => {
    await gw?.stop()
    await upstream?.close()
    cluster?.destroy()
  })

  it('passes SIGHUP to each worker, and every worker sends the rotated key', async () => {
    cluster = await startCluster(bin!)
    const seen: string[] = []
    upstream = await startUpstream((req, res) => {
      seen.push(String(req.headers['x-api-key']))
      res.end('{}')
    })
    const apiKey = secret('workers-api-key', 'key_A_51\n')
    const file = configFile({
      server: { port: 0, admin_port: 0, drain_delay: 0, workers: 2 }, store: { max_connections: 8 },
      routes: [route(upstream.url, { upstream_headers: { 'X-Api-Key': `\${file:${apiKey}}` } })],
    })
    gw = await startGatewayProcess(['--config', file, '--database-url', cluster.url])
    const events = () => gw!.lines.map((l) => JSON.parse(l) as { event: string; worker?: number })
    await until('both workers listening', () => events().filter((e) => e.event === 'listening').length === 2, 60_000)
    writeFileSync(apiKey, 'key_B_62\n')
    gw.child.kill('SIGHUP')
    await until('both workers reloaded', () => events().filter((e) => e.event === 'secrets_reloaded').length === 2, 60_000)
    expect(new Set(events().filter((e) => e.event === 'secrets_reloaded').map((e) => e.worker))).toEqual(new Set([0, 1]))
    // New connections each, so both workers serve some: every one sends the new key.
    const from = gw.lines.length
    const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => post(`${gw!.dataUrl}/payments/w${i}/capture`, '1', { headers: { connection: 'close' } })))
    expect(answers.map((a) => a.status)).toEqual(answers.map(() => 200))
    expect(new Set(seen)).toEqual(new Set(['key_B_62']))
    const servedBy = new Set(gw.lines.slice(from).map((l) => JSON.parse(l) as { event: string; worker?: number }).filter((e) => e.event === 'request').map((e) => e.worker))
    expect(servedBy).toEqual(new Set([0, 1]))
  }, 120_000)
})
