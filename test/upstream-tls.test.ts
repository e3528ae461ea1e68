import { copyFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { ConfigError } from '../src/config/schema.js'
import { silentLogger } from '../src/observe/log.js'
import { startRuleRegistry } from '../src/rules/registry.js'
import { loadUpstreamTls } from '../src/runtime/node/upstream-tls.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { makeTestPki, type TestPki } from './helpers/tls.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'
import { startGatewayProcess, tempDir, writeConfig, type GatewayProcess } from './helpers/process.js'

/**
 * Per-route upstream TLS against a real `node:https` upstream that requires a client
 * certificate signed by a throwaway CA (made by openssl). A handshake that fails sends nothing,
 * so a held key is released, and the same key, retried once the gateway restarted with the
 * right files (the documented rotation), executes exactly once.
 */
describe.each(backends())('upstream TLS ($name)', (backend) => {
  let pki: TestPki
  let mtls: TestUpstream
  let rogue: TestUpstream
  let t: TestDb

  beforeAll(async () => {
    pki = makeTestPki()
    const served = (pair: { certFile: string; keyFile: string }) => ({ cert: pki.read(pair.certFile), key: pki.read(pair.keyFile) })
    // Requires a client certificate of the CA; its own certificate is for 127.0.0.1 and localhost.
    mtls = await startUpstream(undefined, { tls: { ...served(pki.server), ca: pki.read(pki.caFile), requestCert: true, rejectUnauthorized: true } })
    // A server whose certificate another CA signed.
    rogue = await startUpstream(undefined, { tls: served(pki.rogue) })
    t = await backend.open()
  })
  afterAll(async () => {
    await mtls?.close()
    await rogue?.close()
    await t?.close()
    pki?.remove()
  })

  const client = () => ({ ca_file: pki.caFile, cert_file: pki.client.certFile, key_file: pki.client.keyFile })
  const keyed = (upstream: string, tls: Record<string, unknown> | undefined) =>
    route(upstream, { idempotency: 'required', ...(tls ? { upstream_tls: tls } : {}) })
  async function gatewayWith(upstream: string, tls: Record<string, unknown> | undefined): Promise<TestGateway> {
    return startTestGateway({ config: testConfig([keyed(upstream, tls)]), store: t.store })
  }
  const send = (gw: TestGateway, key: string, fence = '1', invoice = '1') =>
    post(`${gw.url}/payments/${invoice}/capture`, fence, { headers: { 'idempotency-key': key } })
  async function stateOf(key: string): Promise<string | undefined> {
    const rows = await t.db.sql<{ state: string }>`SELECT state FROM fg_idempotency WHERE key = ${key}`
    return rows[0]?.state
  }

  it('forwards with the route\'s client certificate and CA', async () => {
    const gw = await gatewayWith(mtls.url, client())
    try {
      const before = mtls.received.length
      const res = await send(gw, 'with-cert', '1', '10')
      expect([res.status, res.json.method]).toEqual([200, 'POST'])
      expect(mtls.received.length).toBe(before + 1)
    } finally {
      await gw.close()
    }
  })

  it.each([
    ['without a client certificate', 'no-cert', () => ({ ca_file: pki.caFile }), () => mtls],
    ['to a server whose certificate the route\'s CA did not sign', 'untrusted', () => ({ ...client() }), () => rogue],
    ['without upstream_tls, to a certificate no system CA signed', 'system-ca', () => undefined, () => rogue],
  ])('%s: 502 upstream_tls_failed, nothing sent, the key released; retried with the right files it executes once', async (_what, key, tls, target) => {
    const upstream = target()
    const before = upstream.received.length
    const gw = await gatewayWith(upstream.url, tls())
    try {
      const refused = await send(gw, key, '1', key)
      expect([refused.status, refused.json.code]).toEqual([502, 'upstream_tls_failed'])
      expect(refused.headers.get('retry-after')).toBeNull()
      expect(upstream.received.length).toBe(before)
      // Released, not outcome_unknown: no record stays for the key.
      expect(await stateOf(key)).toBeUndefined()
    } finally {
      await gw.close()
    }
    // The operator fixes the files and restarts: the same key is forwarded, once.
    const fixed = await gatewayWith(mtls.url, client())
    try {
      const seen = mtls.received.length
      expect((await send(fixed, key, '1', key)).status).toBe(200)
      expect((await send(fixed, key, '1', key)).headers.get('idempotent-replayed')).toBe('true')
      expect(mtls.received.length).toBe(seen + 1)
      expect(await stateOf(key)).toBe('completed')
    } finally {
      await fixed.close()
    }
  })

  it('verifies the certificate against servername: a name it is not for is refused, one it is for is forwarded', async () => {
    const wrong = await gatewayWith(mtls.url, { ...client(), servername: 'payments.example.com' })
    try {
      const res = await send(wrong, 'wrong-name', '1', '20')
      expect([res.status, res.json.code]).toEqual([502, 'upstream_tls_failed'])
      expect(await stateOf('wrong-name')).toBeUndefined()
    } finally {
      await wrong.close()
    }
    const right = await gatewayWith(mtls.url, { ...client(), servername: 'localhost' })
    try {
      expect((await send(right, 'right-name', '1', '21')).status).toBe(200)
    } finally {
      await right.close()
    }
  })

  it('reject_unauthorized: false (loopback only) forwards to a certificate no CA it knows signed', async () => {
    const gw = await gatewayWith(rogue.url, { reject_unauthorized: false })
    try {
      expect((await send(gw, 'unverified', '1', '30')).status).toBe(200)
    } finally {
      await gw.close()
    }
  })

  it('a rule that changes the route keeps the file\'s TLS on the file\'s origin; the rules API cannot set it', async () => {
    const db = await backend.open()
    const config = testConfig([keyed(mtls.url, client())])
    const registry = await startRuleRegistry({ db: db.db, config, log: silentLogger })
    const gw = await startTestGateway({ config, store: db.store, rules: { registry, db: db.db } })
    try {
      const stored = (await fetch(`${gw.adminUrl}/rules/capture`).then((r) => r.json()) as { rule: Record<string, unknown> }).rule
      expect(stored.upstream_tls).toBeUndefined()
      const put = (rule: Record<string, unknown>) => fetch(`${gw.adminUrl}/rules/capture`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(rule) })
      expect((await put({ ...stored, timeout_ms: 4000 })).status).toBe(200)
      expect((await send(gw, 'after-rule', '1', '40')).status).toBe(200)
      expect((await put({ ...stored, upstream_tls: { ca_file: pki.otherCaFile } })).status).toBe(422)
    } finally {
      await gw.close()
      await registry.close()
      await db.close()
    }
  })

  it('reads the files at start: one that is missing fails naming its field, a key of another certificate too', () => {
    const routes = (tls: Record<string, unknown>) => testConfig([route(mtls.url), route(mtls.url, { name: 'other', path: '/other/:invoice_id', upstream_tls: tls })]).routes
    const problems = (tls: Record<string, unknown>) => {
      try {
        loadUpstreamTls(routes(tls))
      } catch (err) {
        expect(err).toBeInstanceOf(ConfigError)
        return (err as ConfigError).problems
      }
      return []
    }
    expect(problems({ ...client(), cert_file: `${pki.dir}/missing.crt` })).toEqual([`routes[1].upstream_tls.cert_file: cannot read ${pki.dir}/missing.crt (ENOENT)`])
    expect(problems({ ...client(), ca_file: `${pki.dir}/nope.pem`, key_file: `${pki.dir}/nope.key` })).toEqual([
      `routes[1].upstream_tls.ca_file: cannot read ${pki.dir}/nope.pem (ENOENT)`,
      `routes[1].upstream_tls.key_file: cannot read ${pki.dir}/nope.key (ENOENT)`,
    ])
    expect(problems({ ...client(), key_file: pki.server.keyFile })).toEqual([expect.stringMatching(/^routes\[1\]\.upstream_tls: the files do not make a TLS context/)])
    expect(problems(client())).toEqual([])
  })
})

/**
 * Rotation without a restart: `fencegate serve` reads the files again on SIGHUP. Run as its
 * own process (the built CLI), since the signal is the process's.
 */
describe('upstream TLS files read again on SIGHUP', () => {
  let pki: TestPki
  let mtls: TestUpstream
  let gw: GatewayProcess | undefined

  beforeAll(async () => {
    pki = makeTestPki()
    mtls = await startUpstream(undefined, { tls: { cert: pki.read(pki.server.certFile), key: pki.read(pki.server.keyFile), ca: pki.read(pki.caFile), requestCert: true, rejectUnauthorized: true } })
  })
  afterAll(async () => {
    await gw?.stop()
    await mtls?.close()
    pki?.remove()
  })

  /** Resolves with the first log line of `event` printed from now on. */
  function nextLine(p: GatewayProcess, event: string): Promise<Record<string, unknown>> {
    return new Promise((resolve) => {
      const seen = p.lines.length
      const check = () => {
        const line = p.lines.slice(seen).map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.event === event)
        if (!line) return
        p.child.stdout!.off('data', onData)
        resolve(line)
      }
      // The helper parses lines on the same event; look once it has.
      const onData = () => setImmediate(check)
      p.child.stdout!.on('data', onData)
    })
  }

  it('a rotated client certificate is used after SIGHUP; files that do not load leave the last good ones in use', async () => {
    const live = { cert: join(pki.dir, 'live.crt'), key: join(pki.dir, 'live.key') }
    // First a certificate the upstream's CA did not sign.
    copyFileSync(pki.rogue.certFile, live.cert)
    copyFileSync(pki.rogue.keyFile, live.key)
    const config = writeConfig({
      server: { port: 0, admin_port: 0 }, log: { level: 'info' },
      routes: [keyed(mtls.url, { ca_file: pki.caFile, cert_file: live.cert, key_file: live.key })],
    })
    gw = await startGatewayProcess(['--config', config, '--data-dir', tempDir('fencegate-tls-data-')])
    const send = (key: string) => post(`${gw!.dataUrl}/payments/1/capture`, '1', { headers: { 'idempotency-key': key } })
    expect((await send('rotated')).json.code).toBe('upstream_tls_failed')
    copyFileSync(pki.client.certFile, live.cert)
    copyFileSync(pki.client.keyFile, live.key)
    const reloaded = nextLine(gw, 'upstream_tls_reloaded')
    gw.child.kill('SIGHUP')
    expect(await reloaded).toMatchObject({ routes: 1 })
    expect((await send('rotated')).status).toBe(200)
    expect(mtls.received).toHaveLength(1)
    // A key file that is not a key: the reload fails, the gateway stays up with the files it had.
    writeFileSync(live.key, 'not a key')
    const failed = nextLine(gw, 'upstream_tls_reload_failed')
    gw.child.kill('SIGHUP')
    expect(String((await failed).problems)).toMatch(/routes\[0\]\.upstream_tls: the files do not make a TLS context/)
    expect((await send('after-failed-reload')).status).toBe(200)
    expect(mtls.received).toHaveLength(2)
  })
})

function keyed(upstream: string, tls: Record<string, unknown>) {
  return route(upstream, { idempotency: 'required', upstream_tls: tls })
}
