import { z } from 'zod'

const file = z.string().min(1, 'expected a file path')

/**
 * A route's TLS to its upstream: a CA bundle to trust instead of the system's (`ca_file`), a
 * client certificate (`cert_file` with `key_file`, PEM), the name to send as SNI and verify
 * the certificate against (`servername`), and `reject_unauthorized` (default true). The files
 * are read when the gateway starts (src/runtime/node/upstream-tls.ts).
 */
export const upstreamTlsSchema = z.object({
  ca_file: file.optional(),
  cert_file: file.optional(),
  key_file: file.optional(),
  servername: z.string().regex(/^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/, 'expected a DNS name such as api.example.com').optional(),
  reject_unauthorized: z.boolean().default(true),
}).strict()

/** One validated `upstream_tls`. */
export type UpstreamTlsConfig = z.output<typeof upstreamTlsSchema>

/** Whether a URL host is this machine: 127.0.0.0/8, ::1 or localhost. */
export function isLoopbackHost(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, '').toLowerCase()
  return host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host)
}

/**
 * The checks of `upstream_tls` against its route: only on an `https` upstream, a certificate
 * with its key, and `reject_unauthorized: false` only for an upstream on this machine, where
 * no network lies between the gateway and the upstream to impersonate it.
 */
export function checkUpstreamTls(tls: UpstreamTlsConfig | undefined, origin: string, ctx: z.RefinementCtx): void {
  if (!tls) return
  const url = new URL(origin)
  if (url.protocol !== 'https:') ctx.addIssue({ code: 'custom', path: ['upstream_tls'], message: 'needs an https upstream' })
  if (tls.cert_file !== undefined && tls.key_file === undefined) ctx.addIssue({ code: 'custom', path: ['upstream_tls', 'key_file'], message: 'required with cert_file (the client certificate\'s private key)' })
  if (tls.key_file !== undefined && tls.cert_file === undefined) ctx.addIssue({ code: 'custom', path: ['upstream_tls', 'cert_file'], message: 'required with key_file (the client certificate)' })
  if (!tls.reject_unauthorized && !isLoopbackHost(url.hostname)) {
    ctx.addIssue({ code: 'custom', path: ['upstream_tls', 'reject_unauthorized'], message: `false is allowed only for an upstream on loopback (127.0.0.1, ::1, localhost), not ${url.hostname}: anyone on the network could answer for it; give its CA as ca_file instead` })
  }
}

/**
 * The identity a route's TLS is pooled by: two routes with the same files, name and check share
 * connections; any difference gets its own.
 *
 * @example upstreamTlsKey({ ca_file: 'ca.pem', reject_unauthorized: true }) // '["ca.pem",null,null,null,true]'
 */
export function upstreamTlsKey(tls: UpstreamTlsConfig): string {
  return JSON.stringify([tls.ca_file ?? null, tls.cert_file ?? null, tls.key_file ?? null, tls.servername ?? null, tls.reject_unauthorized])
}
