// The benchmark's upstream, run as its own process so its CPU is not charged to
// the gateway or to the load generator. It answers every request 200 with a small
// JSON body, and exits on SIGTERM or when its parent goes away (stdin closes).
import { createServer } from 'node:http'

const body = Buffer.from('{"captured":true}')

const server = createServer((req, res) => {
  req.resume()
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length })
    res.end(body)
  })
})
// Longer than any scenario gap, so the gateway's pooled connections are reused, not redialled.
server.keepAliveTimeout = 120_000

server.listen(0, '127.0.0.1', () => {
  const address = server.address()
  process.stdout.write(`${JSON.stringify({ port: typeof address === 'object' && address ? address.port : 0 })}\n`)
})

let stopping = false
const stop = () => {
  if (stopping) return
  stopping = true
  // stdin is still open when the signal comes first, and would keep this process alive.
  process.stdin.destroy()
  server.close()
  server.closeAllConnections()
}
process.once('SIGTERM', stop)
process.once('SIGINT', stop)
process.stdin.once('end', stop)
process.stdin.once('close', stop)
process.stdin.resume()
