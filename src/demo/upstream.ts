import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'

/**
 * A tiny payments-and-tickets API for the example configuration: it counts
 * every side effect so a demo can show what reached it and what did not.
 */
export interface DemoUpstream {
  url: string
  charges: Map<string, number>
  close(): Promise<void>
}

export async function startDemoUpstream(port = 9001, host = '127.0.0.1'): Promise<DemoUpstream> {
  const charges = new Map<string, number>()
  let tickets = 0
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const url = new URL(req.url ?? '/', 'http://upstream')
      const send = (status: number, body: unknown, headers: Record<string, string> = {}) => {
        res.writeHead(status, { 'content-type': 'application/json', ...headers })
        res.end(JSON.stringify(body))
      }
      const capture = /^\/payments\/([^/]+)\/capture$/.exec(url.pathname)
      const invoice = /^\/invoices\/([^/]+)$/.exec(url.pathname)
      if (req.method === 'POST' && capture) {
        const id = decodeURIComponent(capture[1]!)
        const n = (charges.get(id) ?? 0) + 1
        charges.set(id, n)
        return send(200, { invoice: id, captured: true, charge_number: n, fence: req.headers['x-execution-fence'] ?? null })
      }
      if (req.method === 'POST' && url.pathname === '/tickets') {
        tickets += 1
        return send(201, { ticket: tickets }, { location: `/tickets/${tickets}` })
      }
      if (req.method === 'GET' && invoice) {
        const id = decodeURIComponent(invoice[1]!)
        return send(200, { invoice: id, charges: charges.get(id) ?? 0 })
      }
      send(404, { error: 'not found' })
    })
  })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, host, resolve)
  })
  const { port: bound } = server.address() as AddressInfo
  return {
    url: `http://${host}:${bound}`,
    charges,
    close: () => new Promise((resolve) => {
      server.close(() => resolve())
      server.closeAllConnections()
    }),
  }
}
