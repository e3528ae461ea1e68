// The OTLP/HTTP collector of `--traces`: reads and discards every POST body and answers 200,
// in its own process so what exporting costs on the receiving side is not counted as the
// gateway's. `GET /stats` says how many export requests and bytes it received, so the report
// can show spans were exported (parsing the protobuf to count spans would cost this process
// more than the gateway's export does; requests and bytes are enough to show they arrived).
import { createServer } from 'node:http'
import { serveUntilParentGoes } from './child.js'

let requests = 0
let bytes = 0
const ok = Buffer.from('{}')

const server = createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/stats') {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ requests, bytes }))
    return
  }
  req.on('data', (chunk: Buffer) => (bytes += chunk.length))
  req.on('end', () => {
    requests++
    // An empty ExportTraceServiceResponse: `{}` is valid JSON, and an empty protobuf message too
    // is accepted (the exporters do not read a 200's body beyond partial success).
    res.writeHead(200, { 'content-type': req.headers['content-type'] === 'application/json' ? 'application/json' : 'application/x-protobuf' })
    res.end(req.headers['content-type'] === 'application/json' ? ok : undefined)
  })
})
server.keepAliveTimeout = 120_000
serveUntilParentGoes(server)
