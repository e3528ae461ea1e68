// Reference: the fence a user would write by hand instead of running fencegate, in its own
// process (`node ref-fence.js <upstream> <database-url>`; prints {"port":N}).
//
//   POST /<anything>/:id/capture with X-Execution-Fence: read the body, one upsert on its own
//   table that only moves the fence up (`WHERE fence <= new`), forward, stream the answer back.
//   With an Idempotency-Key as well, the two statements a careful user writes: reserve the key
//   (with a hash of the request), then the fence; forward; store the answer, then send it. A
//   key seen before is answered from its row (or 409 while in flight, 422 for another payload).
//
// Each statement is autocommitted (a durable commit each): 1 round trip before forwarding for
// a fence, 2 before and 1 after for a fence + key. Its tables: `referenceSchema` in bench/store.ts.
import { createHash } from 'node:crypto'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { pipeline } from 'node:stream'
import postgres from 'postgres'
import { Pool } from 'undici'
import { forwardable, serveUntilParentGoes } from './child.js'

const [upstream, databaseUrl, connections] = process.argv.slice(2)
if (upstream && databaseUrl && connections) {
  // As many connections as the gateway's (--pool).
  const sql = postgres(databaseUrl, { max: Number(connections), onnotice: () => {} })
  const pool = new Pool(upstream, { connections: 128, pipelining: 1, keepAliveTimeout: 120_000 })
  const entityOf = (url: string) => /\/([^/]+)\/capture/.exec(url)?.[1]

  const send = (res: ServerResponse, status: number, text: string) => {
    res.writeHead(status, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(text) })
    res.end(text)
  }

  const fence = async (entity: string, value: string): Promise<boolean> => {
    const rows = await sql`
      INSERT INTO hand_fences (entity, fence) VALUES (${entity}, ${value})
      ON CONFLICT (entity) DO UPDATE SET fence = excluded.fence WHERE hand_fences.fence <= excluded.fence
      RETURNING fence`
    return rows.length === 1
  }

  const forward = (req: IncomingMessage, body: Buffer) => pool.request({
    method: 'POST',
    path: req.url!,
    headers: { 'content-type': req.headers['content-type'] ?? 'application/octet-stream', 'content-length': String(body.length) },
    body,
  })

  const fenced = async (req: IncomingMessage, res: ServerResponse, entity: string, value: string, body: Buffer) => {
    if (!(await fence(entity, value))) return send(res, 409, 'stale fence')
    const up = await forward(req, body)
    res.writeHead(up.statusCode, forwardable(up.headers))
    pipeline(up.body, res, () => {})
  }

  const keyed = async (req: IncomingMessage, res: ServerResponse, entity: string, value: string, body: Buffer, key: string) => {
    const hash = createHash('sha256').update(req.url!).update('\n').update(body).digest('hex')
    const reserved = await sql`INSERT INTO hand_keys (key, request_hash) VALUES (${key}, ${hash}) ON CONFLICT (key) DO NOTHING RETURNING key`
    if (reserved.length === 0) {
      const [row] = await sql<{ request_hash: string; status: number | null; content_type: string | null; body: Buffer | null }[]>`
        SELECT request_hash, status, content_type, body FROM hand_keys WHERE key = ${key}`
      if (!row) return send(res, 409, 'key just released; retry')
      if (row.request_hash !== hash) return send(res, 422, 'key reused with another request')
      if (row.status === null) return send(res, 409, 'in flight')
      const stored = row.body ?? Buffer.alloc(0)
      res.writeHead(row.status, { 'content-type': row.content_type ?? 'application/octet-stream', 'content-length': stored.length, 'idempotent-replayed': 'true' })
      return res.end(stored)
    }
    if (!(await fence(entity, value))) {
      await sql`DELETE FROM hand_keys WHERE key = ${key}`
      return send(res, 409, 'stale fence')
    }
    const up = await forward(req, body)
    const answer = Buffer.from(await up.body.arrayBuffer())
    const type = String(up.headers['content-type'] ?? 'application/octet-stream')
    await sql`UPDATE hand_keys SET status = ${up.statusCode}, content_type = ${type}, body = ${answer} WHERE key = ${key}`
    res.writeHead(up.statusCode, { 'content-type': type, 'content-length': answer.length })
    res.end(answer)
  }

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = []
    for await (const chunk of req) chunks.push(chunk as Buffer)
    const body = Buffer.concat(chunks)
    const entity = entityOf(req.url!)
    const value = req.headers['x-execution-fence']
    if (!entity || typeof value !== 'string' || !/^\d{1,18}$/.test(value)) return send(res, 400, 'need /:id/capture and X-Execution-Fence')
    const key = req.headers['idempotency-key']
    if (typeof key === 'string') return keyed(req, res, entity, value, body, key)
    return fenced(req, res, entity, value, body)
  }

  const server = createServer((req, res) => {
    handle(req, res).catch(() => {
      if (!res.headersSent) send(res, 503, 'store or upstream failed')
      else res.destroy()
    })
  })
  server.keepAliveTimeout = 120_000
  serveUntilParentGoes(server, async () => {
    await pool.close()
    await sql.end({ timeout: 5 })
  })
}
