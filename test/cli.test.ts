import { existsSync, mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { openDb } from '../src/runtime/node/gateway.js'
import { createStore } from '../src/store/store.js'
import { post } from './helpers/gateway.js'
import { runCli, startGatewayProcess, writeConfig, type GatewayProcess } from './helpers/process.js'
import { jwtAuth, token } from './helpers/tokens.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const tempDir = () => mkdtempSync(join(tmpdir(), 'fencegate-cli-'))

// Each CLI run is a new Node process that compiles PGlite and opens (or creates) its data
// directory: 3–12 s apiece on a 2-core host running three test files at once, and one test
// below runs six of them. The claims are the exit codes and outputs, not the time they take.
describe('fencegate CLI', { timeout: 180_000 }, () => {
  it('describes every command and flag', async () => {
    const top = await runCli(['--help'])
    expect(top.code).toBe(0)
    for (const command of ['serve', 'migrate', 'audit']) expect(top.stdout).toContain(command)
    const serve = await runCli(['serve', '--help'])
    for (const flag of ['--config', '--port', '--admin-port', '--database-url']) expect(serve.stdout).toContain(flag)
    const audit = await runCli(['audit', '--help'])
    for (const flag of ['--entity', '--code', '--since', '--json', '--admin-url']) expect(audit.stdout).toContain(flag)
  })

  it('runs as npx fencegate from the project', async () => {
    const { execFile } = await import('node:child_process')
    const out = await new Promise<string>((resolve, reject) => {
      execFile('npx', ['--no-install', 'fencegate', '--help'], { cwd: join(import.meta.dirname, '..') }, (err, stdout) => (err ? reject(err) : resolve(stdout)))
    })
    expect(out).toContain('usage: fencegate <command>')
  })

  it('runs as npx fencegate with a 1 GB heap maximum, 8 MiB semi-spaces and no flags of the caller (its #! line)', async () => {
    const { execFile } = await import('node:child_process')
    const { writeFileSync } = await import('node:fs')
    // Loaded by NODE_OPTIONS into every Node process, npx's own included; in fencegate's it reports the heap limit and exits.
    const probe = join(tempDir(), 'heap-limit.cjs')
    writeFileSync(probe, "if (/cli[\\\\/]main\\.js$/.test(require('node:fs').realpathSync(process.argv[1] ?? '.'))) {\n" +
      "  process.stdout.write(String(require('node:v8').getHeapStatistics().heap_size_limit)); process.exit(0)\n}\n")
    const out = await new Promise<string>((resolve, reject) => {
      execFile('npx', ['--no-install', 'fencegate', '--help'], { cwd: join(import.meta.dirname, '..'), env: { ...process.env, NODE_OPTIONS: `--require ${probe}` } },
        (err, stdout) => (err ? reject(err) : resolve(stdout)))
    })
    const limitMiB = Number(out) / 2 ** 20
    // 1024 MiB of old generation plus the young generation's three semi-spaces' worth (V8 on
    // Node 20): 1048 with 8 MiB semi-spaces, 1072 with the default 16; about 4 GiB with no flags.
    expect(limitMiB).toBe(1024 + 3 * 8)
  })

  it('npm start runs Node with the same heap flags as the bin', async () => {
    const { readFileSync } = await import('node:fs')
    const root = join(import.meta.dirname, '..')
    const shebang = readFileSync(join(root, 'src', 'cli', 'main.ts'), 'utf8').split('\n')[0]!
    const flags = shebang.replace('#!/usr/bin/env -S node ', '').split(' ')
    expect(flags).toEqual(['--max-old-space-size=1024', '--max-semi-space-size=8'])
    const start = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).scripts.start as string
    expect(start).toBe(`node ${flags.join(' ')} dist/scripts/start.js`)
  })

  it('exits 2 with the usage on an unknown command or flag', async () => {
    expect((await runCli(['frobnicate'])).code).toBe(2)
    const bad = await runCli(['audit', '--no-such-flag'])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('usage: fencegate audit')
  })

  it('refuses to start on an invalid configuration, naming each bad field', async () => {
    const config = writeConfig({ server: { port: 'eighty' }, routes: [{ name: 'r', method: 'POST', path: '/x/:id', upstream: 'ftp://x', entity: 'x:{params.id}', fence: 'sometimes' }] })
    const res = await runCli(['serve', '--config', config])
    expect(res.code).toBe(2)
    expect(res.stderr).toContain('server.port')
    expect(res.stderr).toContain('routes[0].upstream')
    expect(res.stderr).toContain('routes[0].fence')
  })

  it('refuses a configuration that uses an unset environment variable', async () => {
    const config = writeConfig({ store: { url: '${FENCEGATE_TEST_UNSET}' }, routes: [{ name: 'r', method: 'POST', path: '/x', upstream: 'http://127.0.0.1:1', fence: 'off' }] })
    const res = await runCli(['serve', '--config', config])
    expect(res.code).toBe(2)
    expect(res.stderr).toContain('FENCEGATE_TEST_UNSET')
  })

  it('migrates an embedded store idempotently and reads its audit trail from the database', async () => {
    const dir = tempDir()
    expect((await runCli(['migrate', '--data-dir', dir])).code).toBe(0)
    expect((await runCli(['migrate', '--data-dir', dir])).code).toBe(0)
    const store = createStore(await openDb(undefined, dir))
    await store.recordRejection({
      tenant: 'default', route: 'capture', entity: 'invoice:9', code: 'invalid_fence', presentedFence: null, highestFence: null,
      method: 'POST', path: '/payments/9/capture', bodySha256: null, caller: null, requestId: 'cli-1',
    })
    await store.close()
    const json = await runCli(['audit', '--data-dir', dir, '--json', '--entity', 'invoice:9'])
    expect(json.code).toBe(0)
    expect(JSON.parse(json.stdout)).toMatchObject({ items: [{ request_id: 'cli-1', code: 'invalid_fence' }], next_cursor: null })
    const table = await runCli(['audit', '--data-dir', dir, '--code', 'invalid_fence'])
    expect(table.stdout).toContain('cli-1')
    const badSince = await runCli(['audit', '--data-dir', dir, '--since', 'yesterday'])
    expect(badSince.code).toBe(2)
    expect(badSince.stderr).toContain('--since')
  })

  it('refuses a database migrated by a newer fencegate', async () => {
    const dir = tempDir()
    const db = await openDb(undefined, dir)
    await db.sql`INSERT INTO fg_migrations (id, name) VALUES (9999, 'future')`
    await db.close()
    const res = await runCli(['migrate', '--data-dir', dir])
    expect(res.code).toBe(2)
    expect(res.stderr).toContain('newer than this fencegate')
  })

  describe('with a gateway running on an embedded store', () => {
    let upstream: TestUpstream
    let gateway: GatewayProcess
    const dir = tempDir()
    beforeAll(async () => {
      upstream = await startUpstream()
      const config = writeConfig({
        server: { port: 0, admin_port: 0 },
        store: { data_dir: dir },
        routes: [{ name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: upstream.url, entity: 'invoice:{params.id}' }],
      })
      gateway = await startGatewayProcess(['--config', config])
    })
    afterAll(async () => {
      await gateway?.stop()
      await upstream?.close()
    })

    it('serve --data-dir overrides store.data_dir', async () => {
      const other = tempDir()
      const config = writeConfig({ server: { port: 0, admin_port: 0 }, routes: [{ name: 'r', method: 'POST', path: '/x', upstream: upstream.url, fence: 'off' }] })
      const g = await startGatewayProcess(['--config', config, '--data-dir', other])
      try {
        expect(existsSync(join(other, 'fencegate.pid'))).toBe(true)
      } finally {
        await g.stop()
      }
    })

    it('reads the audit trail through --admin-url, and refuses to open the held store directly', async () => {
      await post(`${gateway.dataUrl}/payments/1/capture`, '5')
      await post(`${gateway.dataUrl}/payments/1/capture`, '4', { headers: { 'x-request-id': 'stale-cli' } })
      const res = await runCli(['audit', '--admin-url', gateway.adminUrl, '--code', 'stale_fence', '--json'])
      expect(res.code).toBe(0)
      expect(JSON.parse(res.stdout).items).toMatchObject([{ request_id: 'stale-cli', presented_fence: '4', highest_fence: '5' }])
      const direct = await runCli(['audit', '--data-dir', dir])
      expect(direct.code).toBe(1)
      expect(direct.stderr).toContain('in use by process')
    })
  })
})

describe('fencegate audit against a JWT-protected admin plane', () => {
  it('sends --token (or FENCEGATE_TOKEN) as a bearer token', async () => {
    const upstream = await startUpstream()
    const config = writeConfig({
      server: { port: 0, admin_port: 0 },
      store: { data_dir: tempDir() },
      auth: jwtAuth,
      routes: [{ name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: upstream.url, entity: 'invoice:{params.id}' }],
    })
    const gateway = await startGatewayProcess(['--config', config])
    try {
      const admin = await token({ scope: 'fencegate:admin' })
      expect((await runCli(['audit', '--admin-url', gateway.adminUrl, '--json'])).code).toBe(2)
      expect((await runCli(['audit', '--admin-url', gateway.adminUrl, '--json', '--token', admin])).code).toBe(0)
      expect((await runCli(['audit', '--admin-url', gateway.adminUrl, '--json'], { FENCEGATE_TOKEN: admin })).code).toBe(0)
    } finally {
      await gateway.stop()
      await upstream.close()
    }
  })
})

describe('npm run demo', () => {
  it('plays a double click and a stale worker: one charge, one stale_fence in the audit trail', async () => {
    const { spawn } = await import('node:child_process')
    const out = await new Promise<{ code: number | null; stdout: string }>((resolve) => {
      const child = spawn(process.execPath, [join(import.meta.dirname, '../dist/scripts/demo.js')], { env: { ...process.env, DATABASE_URL: undefined } })
      let stdout = ''
      child.stdout.on('data', (c: Buffer) => (stdout += c))
      child.on('close', (code) => resolve({ code, stdout }))
    })
    expect(out.code).toBe(0)
    expect(out.stdout).toContain('(replayed, no upstream call)')
    expect(out.stdout).toContain('-> 409 stale_fence')
    expect(out.stdout).toContain('charged invoice 7 1 time(s)')
    expect(out.stdout).toContain('stale_fence invoice:7 presented 1, highest 2')
  })
})
