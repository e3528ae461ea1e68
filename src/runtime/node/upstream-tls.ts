import { readFileSync } from 'node:fs'
import { createSecureContext, type TLSSocket } from 'node:tls'
import { buildConnector } from 'undici'
import { ConfigError, type RouteConfig } from '../../config/schema.js'
import { upstreamTlsKey, type UpstreamTlsConfig } from '../../config/upstream-tls.js'

/** One route TLS identity's material, read from its files. */
export interface TlsMaterial {
  ca?: Buffer
  cert?: Buffer
  key?: Buffer
  servername?: string
  rejectUnauthorized: boolean
}

/** Every route's TLS material, by `upstreamTlsKey`. */
export type UpstreamTlsMaterial = ReadonlyMap<string, TlsMaterial>

/**
 * Reads every route's `upstream_tls` files, once, at start: a file that cannot be read, or a
 * certificate and key that do not make a TLS context (a key of another certificate), fails
 * start naming the field, e.g. `routes[2].upstream_tls.cert_file`. Rotated files are read
 * again on SIGHUP (`RunningGateway.reloadUpstreamTls`) or by a restart (docs/operations.md#upstream-tls).
 *
 * @example
 * const tls = loadUpstreamTls(config.routes)
 * const upstream = createUndiciForward({ tls })
 */
export function loadUpstreamTls(routes: readonly RouteConfig[]): UpstreamTlsMaterial {
  const material = new Map<string, TlsMaterial>()
  const problems: string[] = []
  routes.forEach((route, i) => {
    const tls = route.upstream_tls
    if (!tls || material.has(upstreamTlsKey(tls))) return
    const at = `routes[${i}].upstream_tls`
    const read = (field: 'ca_file' | 'cert_file' | 'key_file'): Buffer | undefined => {
      const path = tls[field]
      if (path === undefined) return undefined
      try {
        return readFileSync(path)
      } catch (err) {
        problems.push(`${at}.${field}: cannot read ${path} (${(err as { code?: string }).code ?? 'error'})`)
        return undefined
      }
    }
    const loaded = materialOf(tls, read('ca_file'), read('cert_file'), read('key_file'))
    if (problems.length > 0) return
    try {
      createSecureContext(loaded)
    } catch (err) {
      problems.push(`${at}: the files do not make a TLS context (${(err as { code?: string }).code ?? 'error'}); is key_file the key of cert_file, and are they PEM?`)
      return
    }
    material.set(upstreamTlsKey(tls), loaded)
  })
  if (problems.length > 0) throw new ConfigError(problems)
  return material
}

function materialOf(tls: UpstreamTlsConfig, ca: Buffer | undefined, cert: Buffer | undefined, key: Buffer | undefined): TlsMaterial {
  return {
    ...(ca ? { ca } : {}), ...(cert ? { cert } : {}), ...(key ? { key } : {}),
    ...(tls.servername ? { servername: tls.servername } : {}),
    rejectUnauthorized: tls.reject_unauthorized,
  }
}

/**
 * A TLS handshake with the upstream that failed: the certificate was not trusted or not for
 * the name, the upstream refused the client certificate, or the connection broke before the
 * handshake was done. It comes from the connector, which gives undici no socket until the
 * handshake is done, so no byte of the request was written.
 */
export class UpstreamTlsError extends Error {
  override name = 'UpstreamTlsError'
  readonly code = 'FG_UPSTREAM_TLS'
  constructor(readonly reason: string) {
    super(`the TLS handshake with the upstream failed (${reason})`)
  }
}

// Failures to reach the upstream at all: counted as unreachable, as over plain TCP.
const unreachable = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'UND_ERR_CONNECT_TIMEOUT'])

// How long a TLS 1.3 connection on a route with upstream_tls waits for the upstream's session
// ticket before it is used anyway: an upstream that sends none costs each new connection this.
const acceptanceWaitMs = 1000

/**
 * An undici connector for an https upstream: undici's own with the route's material, whose
 * handshake failures become `UpstreamTlsError`. Over TLS 1.3 the client's handshake ends before
 * the upstream has checked the client's certificate (or its lack of one), and an upstream that
 * refuses it closes the connection after the request was written, which would look like a reset
 * after sending. So on a route with `upstream_tls` a TLS 1.3 connection is handed to undici only
 * once the upstream proved it accepted the client by sending a session ticket (OpenSSL, Go, Java
 * and Node servers send one after that check), or it closed or failed (no byte was written), or
 * `acceptanceWaitMs` passed (an upstream that sends no tickets: classified as before).
 *
 * @example new Pool(origin, { connect: httpsConnector(material, route.timeout_ms) })
 */
export function httpsConnector(material: TlsMaterial | undefined, timeoutMs: number): buildConnector.connector {
  const inner = buildConnector({ timeout: timeoutMs, ...material })
  // Only a route with upstream_tls waits: its upstream is one an operator set up TLS for, the
  // kind that checks client certificates (one without a certificate is refused the same way).
  const confirm = material !== undefined
  return (options, callback) => {
    inner(options, (err, socket) => {
      if (err) return callback(unreachable.has((err as { code?: string }).code ?? '') ? err : new UpstreamTlsError(codeOf(err)), null)
      const tls = socket as TLSSocket
      if (!confirm || tls.getProtocol?.() !== 'TLSv1.3') return callback(null, socket!)
      awaitAcceptance(tls, Math.min(acceptanceWaitMs, timeoutMs), callback)
    })
  }
}

function awaitAcceptance(socket: TLSSocket, waitMs: number, callback: buildConnector.Callback): void {
  const done = (err?: UpstreamTlsError) => {
    clearTimeout(timer)
    socket.off('session', onSession).off('error', onError).off('close', onClose)
    // Not from inside the 'session' event: OpenSSL is still reading the ticket, and a request
    // written from there is never sent (the connection then hangs until headersTimeout).
    if (!err) return void setImmediate(() => callback(null, socket))
    socket.destroy()
    callback(err, null)
  }
  const onSession = () => done()
  const onError = (err: Error) => done(new UpstreamTlsError(codeOf(err)))
  const onClose = () => done(new UpstreamTlsError('the upstream closed the connection before accepting the client certificate'))
  const timer = setTimeout(done, waitMs)
  socket.once('session', onSession).once('error', onError).once('close', onClose)
}

function codeOf(err: Error): string {
  return (err as { code?: string }).code ?? err.name
}
