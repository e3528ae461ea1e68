// The fallback upstream when nginx is not on PATH: a node:http server answering every
// request 200 with a small JSON body, in its own process so its CPU is counted apart.
import { createServer } from 'node:http'
import { serveUntilParentGoes } from './child.js'

const body = Buffer.from('{"captured":true}')

const server = createServer((req, res) => {
  req.resume()
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length })
    res.end(body)
  })
})
// Longer than any gap between cases, so pooled connections are reused, not redialled.
server.keepAliveTimeout = 120_000
serveUntilParentGoes(server)
