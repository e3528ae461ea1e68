// The Workers row of the bench: the same fenced command through the Worker in workerd and
// through the Node gateway, in one run, on one PostgreSQL. The Worker opens a connection per
// request; the Node gateway keeps a pool. `store_ms` is read from each gateway's request log.
//
// Call it from bench/main.ts (or alone: `node dist/bench/workerd.js [requests] [connections]`):
//   const rows = await benchWorkerd({ adminUrl: options.adminUrl })
//   console.log(formatWorkerdRows(rows))
import { execFile, spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Readable } from 'node:stream'
import { promisify } from 'node:util'
import autocannon from 'autocannon'
import { Miniflare } from 'miniflare'
import postgres from 'postgres'
import { migrate } from '../src/store/migrate.js'
import { loadMigrations, packageRoot } from '../src/store/migrations-fs.js'
import { connectPostgres } from '../src/store/postgres.js'
import { freePort } from './procs.js'

export interface WorkerdBenchOptions {
  /** A PostgreSQL URL allowed to create a database; one is created and dropped. */
  adminUrl: string
  /** Requests per runtime (after a warm-up of a tenth of it). */
  requests?: number
  connections?: number
}

export interface WorkerdBenchRow {
  runtime: 'workerd' | 'node'
  requests: number
  rps: number
  /** Mean and median store time per request, from the request log's `store_ms`. */
  storeMsMean: number
  storeMsP50: number
  non2xx: number
}

/**
 * Measures requests/s and per-request store time for a fenced command, workerd vs Node.
 *
 * @example
 * const rows = await benchWorkerd({ adminUrl: 'postgres://postgres@127.0.0.1:5432/test', requests: 2000 })
 */
export async function benchWorkerd(o: WorkerdBenchOptions): Promise<WorkerdBenchRow[]> {
  const requests = o.requests ?? 3000
  const connections = o.connections ?? 10
  const name = `fencegate_wb_${Date.now().toString(36)}`
  const admin = postgres(o.adminUrl, { max: 1, onnotice: () => {} })
  await admin.unsafe(`CREATE DATABASE ${name}`)
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-wb-'))
  const upstream = createServer((req, res) => req.resume().on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}')))
  try {
    const url = new URL(o.adminUrl)
    url.pathname = `/${name}`
    const db = connectPostgres(url.toString(), { max: 1 })
    await migrate(db, loadMigrations())
    await db.close()
    await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve))
    const config = configText(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`)
    return [
      await measure('workerd', (onLog) => startWorker(dir, config, url.toString(), onLog), requests, connections),
      await measure('node', (onLog) => startNode(dir, config, url.toString(), onLog), requests, connections),
    ]
  } finally {
    upstream.close()
    rmSync(dir, { recursive: true, force: true })
    await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    await admin.end()
  }
}

function configText(upstream: string): string {
  return ['server:', '  port: ${PORT}', '  admin_port: 0', 'log:', '  level: info', 'routes:', '  - name: capture', '    method: POST',
    '    path: /payments/:id/capture', `    upstream: "${upstream}"`, "    entity: 'invoice:{params.id}'", ''].join('\n')
}

interface Running { url: string; stop(): Promise<void> }

async function measure(runtime: WorkerdBenchRow['runtime'], start: (onLog: (text: string) => void) => Promise<Running>, requests: number, connections: number): Promise<WorkerdBenchRow> {
  let storeMs: number[] = []
  let partial = ''
  const gateway = await start((text) => {
    const lines = (partial + text).split('\n')
    partial = lines.pop() ?? ''
    for (const line of lines) {
      const match = line.includes('"event":"request"') ? /"store_ms":([0-9.]+)/.exec(line) : null
      if (match) storeMs.push(Number(match[1]))
    }
  })
  try {
    await load(gateway.url, Math.max(connections, Math.floor(requests / 10)), connections)
    storeMs = []
    const result = await load(gateway.url, requests, connections)
    const sorted = [...storeMs].sort((a, b) => a - b)
    return {
      runtime, requests: result.requests, rps: result.rps, non2xx: result.non2xx,
      storeMsMean: sorted.reduce((a, b) => a + b, 0) / Math.max(1, sorted.length), storeMsP50: sorted[Math.floor(sorted.length / 2)] ?? NaN,
    }
  } finally {
    await gateway.stop()
  }
}

async function load(url: string, amount: number, connections: number): Promise<{ requests: number; rps: number; non2xx: number }> {
  const started = performance.now()
  let n = 0
  const result = await autocannon({
    url, connections, amount, method: 'POST', timeout: 10, body: '{"amount":1}',
    headers: { 'content-type': 'application/json', 'x-execution-fence': '1' },
    requests: [{ setupRequest: (req) => ({ ...req, path: `/payments/${n++ % 1000}/capture` }) }],
  })
  const seconds = (performance.now() - started) / 1000
  return { requests: result.requests.total, rps: result.requests.total / seconds, non2xx: result.non2xx + result.errors }
}

async function startWorker(dir: string, config: string, databaseUrl: string, onLog: (text: string) => void): Promise<Running> {
  const root = packageRoot()
  const out = join(dir, 'bundle')
  await promisify(execFile)(process.execPath, [join(root, 'node_modules', 'wrangler', 'bin', 'wrangler.js'), 'deploy', '--dry-run', '--outdir', out, '--config', join(root, 'wrangler.toml')],
    { cwd: root, env: { ...process.env, WRANGLER_SEND_METRICS: 'false', CI: '1' } })
  const toml = readFileSync(join(root, 'wrangler.toml'), 'utf8')
  const mf = new Miniflare({
    modules: [{ type: 'ESModule', path: 'entry.js', contents: readFileSync(join(out, 'entry.js'), 'utf8') }],
    compatibilityDate: JSON.parse(/^compatibility_date = (.*)$/m.exec(toml)![1]!) as string,
    compatibilityFlags: JSON.parse(/^compatibility_flags = (.*)$/m.exec(toml)![1]!) as string[],
    bindings: { FENCEGATE_CONFIG: config, DATABASE_URL: databaseUrl, PORT: '0' },
    port: await freePort(),
    handleRuntimeStdio(stdout: Readable, stderr: Readable) {
      stdout.setEncoding('utf8').on('data', onLog)
      stderr.resume()
    },
  })
  const url = await mf.ready
  return { url: url.origin, stop: () => mf.dispose() }
}

async function startNode(dir: string, config: string, databaseUrl: string, onLog: (text: string) => void): Promise<Running> {
  const root = packageRoot()
  const port = await freePort()
  const file = join(dir, 'node.yaml')
  writeFileSync(file, config)
  const child = spawn(process.execPath, ['--max-old-space-size=1024', '--max-semi-space-size=8', join(root, 'dist', 'src', 'cli', 'main.js'), 'serve', '--config', file, '--database-url', databaseUrl],
    { env: { ...process.env, PORT: String(port) }, stdio: ['ignore', 'pipe', 'inherit'] })
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  await new Promise<void>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`the Node gateway exited with ${code}`)))
    child.stdout!.setEncoding('utf8').on('data', (text: string) => {
      if (text.includes('"listening"')) resolve()
      onLog(text)
    })
  })
  return {
    url: `http://127.0.0.1:${port}`,
    async stop() {
      child.kill('SIGTERM')
      await exited
    },
  }
}

/** The rows as a small table for the report. */
export function formatWorkerdRows(rows: WorkerdBenchRow[]): string {
  const lines = ['runtime  | req/s | store ms mean | store ms p50 | non-2xx', '---|---|---|---|---']
  for (const r of rows) lines.push(`${r.runtime} | ${r.rps.toFixed(0)} | ${r.storeMsMean.toFixed(2)} | ${r.storeMsP50.toFixed(2)} | ${r.non2xx}`)
  return lines.join('\n')
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const rows = await benchWorkerd({
    adminUrl: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
    ...(process.argv[2] ? { requests: Number(process.argv[2]) } : {}),
    ...(process.argv[3] ? { connections: Number(process.argv[3]) } : {}),
  })
  console.log(formatWorkerdRows(rows))
}
