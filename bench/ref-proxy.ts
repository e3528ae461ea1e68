// Reference: the bare Node proxy a user could put in front of an API instead of fencegate.
// node:http in, an undici Pool out, the body streamed both ways, hop-by-hop headers dropped.
// Run as its own process (`node ref-proxy.js <upstream>`); it prints {"port":N} when listening.
import { createServer } from 'node:http'
import { pipeline } from 'node:stream'
import { Pool } from 'undici'
import { forwardable, serveUntilParentGoes } from './child.js'

const upstream = process.argv[2]
if (upstream) {
  const pool = new Pool(upstream, { connections: 128, pipelining: 1, keepAliveTimeout: 120_000 })
  const server = createServer((req, res) => {
    pool.request({ method: req.method as 'POST', path: req.url!, headers: forwardable(req.headers), body: req }).then((up) => {
      res.writeHead(up.statusCode, forwardable(up.headers))
      pipeline(up.body, res, () => {})
    }, () => {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' })
      res.end('bad gateway')
    })
  })
  server.keepAliveTimeout = 120_000
  serveUntilParentGoes(server, async () => pool.close())
}
