// What every server the bench runs as a child process shares: listen on a free loopback
// port, print {"port":N} as the first line on stdout, and stop on SIGTERM/SIGINT or when
// the parent goes away (stdin closes), so no reference server outlives the bench.
import type { IncomingHttpHeaders, Server } from 'node:http'

export function serveUntilParentGoes(server: Server, onStop: () => Promise<void> = async () => {}): void {
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
    void onStop().catch(() => {}).finally(() => process.exit(0))
  }
  process.once('SIGTERM', stop)
  process.once('SIGINT', stop)
  process.stdin.once('end', stop)
  process.stdin.once('close', stop)
  process.stdin.resume()
}

/** Headers that describe one connection, not the message: never forwarded (RFC 9110 §7.6.1). */
export const hopByHop = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'host', 'expect'])

export function forwardable(headers: IncomingHttpHeaders | Record<string, string | string[] | undefined>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {}
  for (const name in headers) {
    const value = headers[name]
    if (value !== undefined && !hopByHop.has(name)) out[name] = value
  }
  return out
}
