// `node dist/bench/trace-seam.js [commands] [ratio|off]`: the CPU per command of the tracing
// seam alone, in this one process: a SERVER span, two store spans, the CLIENT span writing
// `traceparent`, their ends, the SDK's batch processor and the OTLP protobuf exporter sending
// to the bench's sink (its own process). No gateway, no store, no network load: a figure for
// A/B runs of tracing changes on a machine whose load makes the whole bench's figures noisy.
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import type { RouteConfig } from '../src/config/schema.js'
import { endRequestSpan, endUpstreamSpan, startRequestSpan, startUpstreamSpan } from '../src/gateway/spans.js'
import { silentLogger } from '../src/observe/log.js'
import { storeSpans } from '../src/observe/store-spans.js'
import { noTracing } from '../src/observe/tracing.js'
import { startTracing } from '../src/runtime/node/tracing.js'
import { tracingSettings } from '../src/runtime/node/tracing-env.js'

const commands = Number(process.argv[2] ?? 20_000)
const ratio = process.argv[3] ?? '1'
const sink = spawn(process.execPath, [fileURLToPath(new URL('./otlp-sink.js', import.meta.url))], { stdio: ['pipe', 'pipe', 'inherit'] })
const port = await new Promise<number>((resolve) => sink.stdout!.once('data', (d: Buffer) => resolve((JSON.parse(String(d)) as { port: number }).port)))
const settings = ratio === 'off' ? undefined : tracingSettings({
  OTEL_TRACES_EXPORTER: 'otlp', OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: ratio,
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `http://127.0.0.1:${port}/v1/traces`,
})
const { tracing, shutdown } = settings ? startTracing(settings, silentLogger) : { tracing: noTracing, shutdown: async () => {} }
const route = { name: 'capture', path: '/payments/:invoice_id/capture', upstream: { origin: 'http://127.0.0.1:9', basePath: '' } } as unknown as RouteConfig
const store = { reserve: async () => 1, complete: async () => 2, close: async () => {} }
const inbound = new Map([['content-type', 'application/json']])
const headers = { get: (name: string) => inbound.get(name) ?? null, forEach: (f: (value: string, name: string) => void) => inbound.forEach(f) }
const outbound = new Map<string, string>()
const sinkHeaders = { set: (name: string, value: string) => void outbound.set(name, value), delete: (name: string) => void outbound.delete(name) }

async function command(i: number): Promise<void> {
  const span = startRequestSpan(tracing, { method: 'POST', url: new URL(`http://gateway/payments/${i}/capture`), headers } as never)
  const traced = storeSpans(store, span, tracing, 'postgresql')
  await traced.reserve()
  const upstream = startUpstreamSpan(tracing, span, route, 'POST', `/payments/${i}/capture`, sinkHeaders)
  endUpstreamSpan(upstream, 200)
  await traced.complete()
  endRequestSpan({ span, method: 'POST', requestId: `r${i}`, route: { config: route }, fence: '1764850000000000', entity: `invoice:${i}` }, 'forwarded', 200, undefined, true)
}

// In batches with a turn of the event loop between, so the exporter's timer and sockets run as in a gateway.
async function run(n: number): Promise<void> {
  for (let done = 0; done < n; done += 500) {
    for (let i = 0; i < 500; i++) await command(done + i)
    await new Promise((resolve) => setImmediate(resolve))
  }
}

await run(10_000)
const before = process.cpuUsage()
await run(commands)
const cpu = process.cpuUsage(before)
await shutdown()
const stats = (await (await fetch(`http://127.0.0.1:${port}/stats`)).json()) as { requests: number; bytes: number }
sink.kill()
console.log(`tracing ${ratio}: ${((cpu.user + cpu.system) / commands).toFixed(1)} µs CPU per command (the seam alone, URL included); sink received ${stats.requests} export requests, ${(stats.bytes / 1024).toFixed(0)} KiB`)
process.exit(0)
