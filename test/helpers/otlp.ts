import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'

/** A span as a collector receives it, from either protocol, in one shape. */
export interface ReceivedSpan {
  traceId: string
  spanId: string
  parentSpanId: string
  traceState: string
  name: string
  /** 1 internal, 2 server, 3 client (OTLP's SpanKind). */
  kind: number
  attributes: Record<string, string | number | boolean>
  /** 0 unset, 1 ok, 2 error (OTLP's StatusCode). */
  status: { code: number; message: string }
  resource: Record<string, string | number | boolean>
  scope: string
}

export const spanKind = { internal: 1, server: 2, client: 3 } as const

export interface Collector {
  /** Where the exporter sends: `${url}/v1/traces`. */
  url: string
  spans: ReceivedSpan[]
  /** Content types of the export requests received. */
  contentTypes: string[]
  /** Resolves once at least `count` spans in all have arrived. */
  received(count: number): Promise<ReceivedSpan[]>
  /** Resolves once `count` export requests in all have arrived (decoded or not). */
  requested(count: number): Promise<void>
  /** Answers every export with this status from now on (500: a collector in trouble), or never (`hang`). */
  answer(status: number | 'hang'): void
  close(): Promise<void>
}

// --- The OTLP protobuf wire format, read by field number (opentelemetry-proto's trace/v1, common/v1, resource/v1). ---

class Reader {
  pos = 0
  constructor(readonly buf: Buffer) {}
  get done() {
    return this.pos >= this.buf.length
  }
  varint(): bigint {
    let result = 0n
    let shift = 0n
    for (;;) {
      const b = this.buf[this.pos++]!
      result |= BigInt(b & 0x7f) << shift
      if ((b & 0x80) === 0) return result
      shift += 7n
    }
  }
  tag() {
    const t = Number(this.varint())
    return { field: t >>> 3, wire: t & 7 }
  }
  bytes(): Buffer {
    const len = Number(this.varint())
    const out = this.buf.subarray(this.pos, this.pos + len)
    this.pos += len
    return out
  }
  fixed64(): Buffer {
    const out = this.buf.subarray(this.pos, this.pos + 8)
    this.pos += 8
    return out
  }
  skip(wire: number) {
    if (wire === 0) this.varint()
    else if (wire === 1) this.pos += 8
    else if (wire === 2) this.bytes()
    else if (wire === 5) this.pos += 4
    else throw new Error(`wire type ${wire}`)
  }
}

/** Calls `each` with every field of a message. */
function fields(buf: Buffer, each: (field: number, wire: number, r: Reader) => void) {
  const r = new Reader(buf)
  while (!r.done) {
    const { field, wire } = r.tag()
    const before = r.pos
    each(field, wire, r)
    if (r.pos === before) r.skip(wire)
  }
}

function anyValue(buf: Buffer): string | number | boolean {
  let v: string | number | boolean = ''
  fields(buf, (f, _w, r) => {
    if (f === 1) v = r.bytes().toString('utf8')
    else if (f === 2) v = r.varint() !== 0n
    else if (f === 3) v = Number(BigInt.asIntN(64, r.varint()))
    else if (f === 4) v = r.fixed64().readDoubleLE()
  })
  return v
}

function keyValue(buf: Buffer, into: Record<string, string | number | boolean>) {
  let key = ''
  let value: string | number | boolean = ''
  fields(buf, (f, _w, r) => {
    if (f === 1) key = r.bytes().toString('utf8')
    else if (f === 2) value = anyValue(r.bytes())
  })
  into[key] = value
}

function protoSpan(buf: Buffer, resource: ReceivedSpan['resource'], scope: string): ReceivedSpan {
  const s: ReceivedSpan = { traceId: '', spanId: '', parentSpanId: '', traceState: '', name: '', kind: 0, attributes: {}, status: { code: 0, message: '' }, resource, scope }
  fields(buf, (f, _w, r) => {
    if (f === 1) s.traceId = r.bytes().toString('hex')
    else if (f === 2) s.spanId = r.bytes().toString('hex')
    else if (f === 3) s.traceState = r.bytes().toString('utf8')
    else if (f === 4) s.parentSpanId = r.bytes().toString('hex')
    else if (f === 5) s.name = r.bytes().toString('utf8')
    else if (f === 6) s.kind = Number(r.varint())
    else if (f === 9) keyValue(r.bytes(), s.attributes)
    else if (f === 15) fields(r.bytes(), (sf, _sw, sr) => {
      if (sf === 2) s.status.message = sr.bytes().toString('utf8')
      else if (sf === 3) s.status.code = Number(sr.varint())
    })
  })
  return s
}

/** Decodes an ExportTraceServiceRequest. */
export function decodeProtobuf(body: Buffer): ReceivedSpan[] {
  const out: ReceivedSpan[] = []
  fields(body, (f, _w, r) => {
    if (f !== 1) return
    const resource: ReceivedSpan['resource'] = {}
    const scopeSpans: Buffer[] = []
    fields(r.bytes(), (rf, _rw, rr) => {
      if (rf === 1) fields(rr.bytes(), (af, _aw, ar) => (af === 1 ? keyValue(ar.bytes(), resource) : undefined))
      else if (rf === 2) scopeSpans.push(rr.bytes())
    })
    for (const ss of scopeSpans) {
      let scope = ''
      const spans: Buffer[] = []
      fields(ss, (sf, _sw, sr) => {
        if (sf === 1) fields(sr.bytes(), (nf, _nw, nr) => (nf === 1 ? (scope = nr.bytes().toString('utf8')) : undefined))
        else if (sf === 2) spans.push(sr.bytes())
      })
      for (const span of spans) out.push(protoSpan(span, resource, scope))
    }
  })
  return out
}

// --- OTLP/JSON: the same messages, ids in hex, enums as numbers, 64-bit integers as strings. ---

type JsonValue = { stringValue?: string; boolValue?: boolean; intValue?: string | number; doubleValue?: number }

function jsonAttributes(list: { key: string; value: JsonValue }[] | undefined): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {}
  for (const { key, value } of list ?? []) {
    out[key] = value.stringValue ?? value.boolValue ?? (value.intValue !== undefined ? Number(value.intValue) : value.doubleValue ?? '')
  }
  return out
}

/** Decodes an ExportTraceServiceRequest in OTLP/JSON. */
export function decodeJson(body: Buffer): ReceivedSpan[] {
  const request = JSON.parse(body.toString('utf8')) as { resourceSpans: any[] }
  return request.resourceSpans.flatMap((rs) => {
    const resource = jsonAttributes(rs.resource?.attributes)
    return (rs.scopeSpans as any[]).flatMap((ss) => (ss.spans as any[]).map((s): ReceivedSpan => ({
      traceId: s.traceId, spanId: s.spanId, parentSpanId: s.parentSpanId ?? '', traceState: s.traceState ?? '',
      name: s.name, kind: s.kind, attributes: jsonAttributes(s.attributes),
      status: { code: s.status?.code ?? 0, message: s.status?.message ?? '' }, resource, scope: ss.scope?.name ?? '',
    })))
  })
}

function readAll(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => resolve(Buffer.concat(chunks)))
    req.on('error', reject)
  })
}

/**
 * A real OTLP/HTTP trace receiver on loopback: POST /v1/traces in protobuf or JSON, decoded
 * into `spans`, answered 200 with an empty ExportTraceServiceResponse (or as `answer` says).
 */
export async function startCollector(): Promise<Collector> {
  const spans: ReceivedSpan[] = []
  const contentTypes: string[] = []
  const waiters: { count: number; resolve: () => void }[] = []
  const requestWaiters: { count: number; resolve: () => void }[] = []
  let status: number | 'hang' = 200
  // Exports held by `hang`, answered (200, their spans dropped) when it ends.
  const hung: ServerResponse[] = []
  const sockets = new Set<Socket>()
  const server = createServer(async (req, res) => {
    const body = await readAll(req)
    if (req.method !== 'POST' || req.url !== '/v1/traces') {
      res.writeHead(404).end()
      return
    }
    const type = String(req.headers['content-type'])
    contentTypes.push(type)
    for (const w of requestWaiters.filter((w) => contentTypes.length >= w.count)) w.resolve()
    if (status === 'hang') {
      hung.push(res)
      return
    }
    if (status !== 200) {
      res.writeHead(status, { 'content-type': 'text/plain' }).end('collector trouble')
      return
    }
    spans.push(...(type.startsWith('application/json') ? decodeJson(body) : decodeProtobuf(body)))
    for (const w of waiters.filter((w) => spans.length >= w.count)) w.resolve()
    if (type.startsWith('application/json')) res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    else res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end()
  })
  server.on('connection', (s) => {
    sockets.add(s)
    s.on('close', () => sockets.delete(s))
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}`,
    spans,
    contentTypes,
    received(count) {
      if (spans.length >= count) return Promise.resolve(spans)
      return new Promise((resolve) => waiters.push({ count, resolve: () => resolve(spans) }))
    },
    requested(count) {
      if (contentTypes.length >= count) return Promise.resolve()
      return new Promise((resolve) => requestWaiters.push({ count, resolve }))
    },
    answer(s) {
      status = s
      if (s !== 'hang') for (const res of hung.splice(0)) res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end()
    },
    close: () => new Promise((resolve) => {
      for (const s of sockets) s.destroy()
      server.close(() => resolve())
    }),
  }
}
