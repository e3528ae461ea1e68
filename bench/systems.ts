// Starts what the bench measures, each in its own process so each one's CPU is read apart:
// the upstream (nginx `return 200`, or a Node server without nginx), the references (nginx
// `proxy_pass`, the bare Node proxy, the hand-rolled fence) and the fencegate gateway.
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { findNginx, nginxVersion, startNginxProxy, startNginxUpstream } from './nginx.js'
import type { BenchOptions } from './run-options.js'
import { freePort, isHealthy, listeningPort, startChild, startProcess, stopChild, waitUntil, type Child } from './procs.js'
import type { BenchStore } from './fresh-db.js'
import { mcpTool } from './traffic.js'

export type SystemName = 'nginx' | 'bare' | 'hand' | 'gateway' | 'gateway-workers' | 'gateway-traces' | 'gateway-pglite' | 'mcp'

export interface Systems {
  upstream: Child
  upstreamUrl: string
  upstreamWhat: string
  /** Each system's URL and process; absent when it does not run (nginx off PATH, or no case needs it). */
  running: Partial<Record<SystemName, { url: string; child: Child }>>
  /** The OTLP/HTTP sink the tracing gateway exports to (bench/otlp-sink.ts), with `--traces`. */
  sink?: { url: string; child: Child }
  /** Why nginx is not running, for the report. */
  nginxNote: string | undefined
  stop(): Promise<void>
  /** SIGKILL to every process, for a watchdog that cannot wait. */
  kill(): void
}

/**
 * The multi-worker gateway's `store.max_connections`: each worker gets the one-worker
 * gateway's statement pool and its LISTEN connection (src/runtime/node/workers.ts), so a
 * worker is never starved of connections the one-worker gateway has.
 */
export const workersPool = (options: Pick<BenchOptions, 'pool' | 'workers'>) => options.workers * (options.pool + 1)

/** The environment of a gateway that traces at `ratio`, exporting OTLP/HTTP (protobuf, the default) to `sinkUrl`. */
export function tracingEnv(sinkUrl: string, ratio: number): NodeJS.ProcessEnv {
  return {
    OTEL_TRACES_EXPORTER: 'otlp',
    OTEL_TRACES_SAMPLER: 'parentbased_traceidratio',
    OTEL_TRACES_SAMPLER_ARG: String(ratio),
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${sinkUrl}/v1/traces`,
  }
}

/** What the sink has received so far: export requests and body bytes. */
export async function sinkStats(sinkUrl: string): Promise<{ requests: number; bytes: number }> {
  const res = await fetch(`${sinkUrl}/stats`, { signal: AbortSignal.timeout(5000) })
  return (await res.json()) as { requests: number; bytes: number }
}

/** Starts the OTLP sink in its own process, so its CPU is not the gateway's. */
export const startSink = () => nodeServer('otlp-sink', './otlp-sink.js', [])

/**
 * The gateway's config: YAML is a superset of JSON; `warn` keeps per-request info lines out of
 * the measurement. `store` is PostgreSQL's statement pool, or the embedded store's directory.
 */
export function gatewayConfig(upstream: string, port: number, adminPort: number, store: { max_connections: number } | { data_dir: string }, workers = 1, mcpUpstream = upstream): string {
  const route = { method: 'POST', upstream, timeout_ms: 10_000 }
  const entity = 'invoice:{params.invoice_id}'
  return JSON.stringify({
    server: { host: '127.0.0.1', port, admin_host: '127.0.0.1', admin_port: adminPort, workers },
    log: { level: 'warn' },
    store,
    routes: [
      { ...route, name: 'passthrough', path: '/passthrough/:invoice_id/capture', fence: 'off' },
      { ...route, name: 'capture', path: '/payments/:invoice_id/capture', entity, fence: 'required' },
      { ...route, name: 'capture-once', path: '/idempotent/payments/:invoice_id/capture', entity, fence: 'required', idempotency: 'required' },
      { ...route, name: 'capture-body-key', path: '/bodykey/payments/:invoice_id/capture', entity, fence: 'required', idempotency: 'required', idempotency_key: '{body.idempotency_key}' },
      // fg-mcp: the MCP server's endpoint, its one side-effecting tool fenced per invoice and keyed.
      { ...route, name: 'payments-mcp', path: '/mcp', upstream: mcpUpstream, fence: 'off', mcp: [{ tool: mcpTool, entity: 'invoice:{body.params.arguments.invoice_id}', fence: 'required', idempotency: 'required' }] },
      // fg-mcp-rest: the same server behind a plain keyed route (the SDK's handler serves any path).
      { ...route, name: 'payments-mcp-rest', path: '/rest-mcp/:invoice_id', upstream: mcpUpstream, entity, fence: 'required', idempotency: 'required' },
      // fg-mcp-upstream: the same MCP rule in front of the bench's upstream, which answers every call alike.
      { ...route, name: 'payments-mcp-upstream', path: '/mcp-upstream', fence: 'off', mcp: [{ tool: mcpTool, entity: 'invoice:{body.params.arguments.invoice_id}', fence: 'required', idempotency: 'required' }] },
    ],
  }, null, 2)
}

/** How one gateway of the bench is started; the defaults are the one-worker gateway on PostgreSQL. */
export interface GatewayStart {
  dir: string
  upstreamUrl: string
  store: BenchStore
  /** PostgreSQL's statement pool (store.max_connections). */
  pool: number
  nodeOptions: string[]
  logFile?: string | undefined
  name?: string
  env?: NodeJS.ProcessEnv
  workers?: number
  mcpUrl?: string | undefined
  /** The embedded store (PGlite) in this directory instead of PostgreSQL: no DATABASE_URL, as `npm start` runs. */
  dataDir?: string
}

/** Starts the gateway (`fencegate serve`) on a fresh config and waits for its admin /health. */
export async function startGateway(g: GatewayStart): Promise<{ url: string; child: Child }> {
  const name = g.name ?? 'gateway'
  const [port, adminPort] = [await freePort(), await freePort()]
  const configFile = join(g.dir, `${name}.yaml`)
  const store = g.dataDir === undefined ? { max_connections: g.pool } : { data_dir: g.dataDir }
  writeFileSync(configFile, gatewayConfig(g.upstreamUrl, port, adminPort, store, g.workers ?? 1, g.mcpUrl))
  const main = new URL('../src/cli/main.js', import.meta.url)
  const args = ['serve', '--config', configFile]
  const childEnv: NodeJS.ProcessEnv = { ...process.env, ...g.env, DATABASE_URL: g.store.url }
  // The CLI prefers DATABASE_URL to store.data_dir: the embedded gateway must not see it.
  if (g.dataDir !== undefined) delete childEnv.DATABASE_URL
  // With no flags of its own the gateway is run as npx runs it: the file itself, so its
  // #! line and the Node flags in it apply (src/cli/main.ts).
  const child = g.nodeOptions.length === 0
    ? startProcess(name, fileURLToPath(main), args, childEnv, g.logFile)
    : startChild(name, main, args, childEnv, g.nodeOptions, g.logFile)
  await waitUntil(child, 'healthy', () => isHealthy(`http://127.0.0.1:${adminPort}/health`), 60_000)
  return { url: `http://127.0.0.1:${port}`, child }
}

async function nodeServer(name: string, script: string, args: string[]): Promise<{ url: string; child: Child }> {
  const child = startChild(name, new URL(script, import.meta.url), args, process.env)
  return { url: `http://127.0.0.1:${await listeningPort(child)}`, child }
}

/** Polls a TCP port with a request until something answers. */
async function answering(child: Child, url: string): Promise<void> {
  await waitUntil(child, 'listening', async () => {
    const res = await fetch(url, { signal: AbortSignal.timeout(1000) })
    await res.arrayBuffer()
    return true
  }, 10_000)
}

export async function startSystems(options: BenchOptions, store: BenchStore, dir: string, needs: Set<SystemName>): Promise<Systems> {
  const children: Child[] = []
  const stop = async () => {
    for (const c of [...children].reverse()) await stopChild(c)
  }
  const kill = () => {
    for (const c of children) c.process.kill('SIGKILL')
  }
  try {
    const nginx = options.nginx ? findNginx() : undefined
    const nginxNote = nginx ? undefined : options.nginx ? 'nginx is not on PATH: no nginx case, and a Node upstream' : 'nginx skipped (--no-nginx): no nginx case, and a Node upstream'
    let upstream: Child
    let upstreamUrl: string
    let upstreamWhat: string
    if (nginx) {
      const port = await freePort()
      upstream = startNginxUpstream(nginx, dir, port)
      upstreamUrl = `http://127.0.0.1:${port}`
      upstreamWhat = `nginx ${nginxVersion(nginx)} \`return 200\`, 1 process`
      children.push(upstream)
      await answering(upstream, upstreamUrl)
    } else {
      const s = await nodeServer('upstream', './upstream.js', [])
      upstream = s.child
      upstreamUrl = s.url
      upstreamWhat = 'a node:http server answering 200 (bench/upstream.ts)'
      children.push(upstream)
    }
    const running: Systems['running'] = {}
    if (nginx && needs.has('nginx')) {
      const port = await freePort()
      const child = startNginxProxy(nginx, dir, port, Number(new URL(upstreamUrl).port))
      children.push(child)
      running.nginx = { url: `http://127.0.0.1:${port}`, child }
      await answering(child, running.nginx.url)
    }
    if (needs.has('bare')) children.push((running.bare = await nodeServer('bare-proxy', './ref-proxy.js', [upstreamUrl])).child)
    if (needs.has('hand')) children.push((running.hand = await nodeServer('hand-fence', './ref-fence.js', [upstreamUrl, store.url, String(options.pool)])).child)
    // The MCP server before the gateway, whose MCP route points at it.
    if (needs.has('mcp')) children.push((running.mcp = await nodeServer('mcp-server', './mcp-server.js', [])).child)
    const gateway = { dir, upstreamUrl, store, pool: options.pool, nodeOptions: options.gatewayNodeOptions, mcpUrl: running.mcp?.url }
    if (needs.has('gateway')) children.push((running.gateway = await startGateway({ ...gateway, logFile: options.gatewayLog })).child)
    if (needs.has('gateway-workers')) {
      const workers = await startGateway({ ...gateway, pool: workersPool(options), name: 'gateway-workers', workers: options.workers })
      children.push((running['gateway-workers'] = workers).child)
    }
    if (needs.has('gateway-pglite')) {
      const embedded = await startGateway({ ...gateway, name: 'gateway-pglite', dataDir: join(dir, 'pglite') })
      children.push((running['gateway-pglite'] = embedded).child)
    }
    let sink: Systems['sink']
    if (needs.has('gateway-traces') && options.traces !== undefined) {
      children.push((sink = await startSink()).child)
      const traced = await startGateway({ ...gateway, name: 'gateway-traces', env: tracingEnv(sink.url, options.traces) })
      children.push((running['gateway-traces'] = traced).child)
    }
    return { upstream, upstreamUrl, upstreamWhat, running, sink, nginxNote, stop, kill }
  } catch (err) {
    await stop()
    throw err
  }
}
