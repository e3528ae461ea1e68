// The field grammars every section of the configuration shares: integers that may come
// from `${VAR}`, sizes, durations, upstream URLs, header and rule names.
import { z } from 'zod'
import { parseDuration, parseSize } from './units.js'

// Integers may come from `${VAR}` expansion, which always yields a string.
export const integer = (min: number, max: number, what = 'an integer') => z.union([z.number(), z.string().regex(/^\d+$/, `expected ${what}`)])
  .transform(Number)
  .pipe(z.number().int().min(min).max(max))
export const port = integer(0, 65535, 'a port number')

export const size = z.union([z.number(), z.string()]).transform((v, ctx) => {
  const bytes = parseSize(v)
  if (bytes === undefined || bytes < 1) {
    ctx.addIssue({ code: 'custom', message: `expected a size such as 1MiB or 65536, got ${JSON.stringify(v)}` })
    return z.NEVER
  }
  return bytes
})

export const duration = z.union([z.number(), z.string()]).transform((v, ctx) => {
  const ms = parseDuration(v)
  if (ms === undefined) {
    ctx.addIssue({ code: 'custom', message: `expected a duration such as 30s, 24h or 500ms, got ${JSON.stringify(v)}` })
    return z.NEVER
  }
  return ms
})

export const upstream = z.string().transform((v, ctx) => {
  let url: URL
  try {
    url = new URL(v)
  } catch {
    ctx.addIssue({ code: 'custom', message: `expected an http(s) URL, got ${JSON.stringify(v)}` })
    return z.NEVER
  }
  if (!['http:', 'https:'].includes(url.protocol) || url.username || url.password || url.search || url.hash) {
    ctx.addIssue({ code: 'custom', message: 'expected an http(s) URL without credentials, query or fragment' })
    return z.NEVER
  }
  return { origin: url.origin, basePath: url.pathname.replace(/\/+$/, '') }
})

// Routes and entity rules share one namespace (the rules API addresses both by name).
export const ruleName = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'expected 1-64 letters, digits, _ . -')

export const headerName = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/

/**
 * The error envelopes a route may answer its refusals in, beside the problem+json members:
 * `stripe` (`error: {type, code, message}`), `square` (`errors: [{category, code, detail}]`),
 * `adyen` (`errorCode`, `message`, `errorType` beside `status`), `resend` (`name`, `message`,
 * `statusCode`). Each is what that API's official SDK reads its error from (src/http/envelopes.ts).
 */
export const errorEnvelopes = ['stripe', 'square', 'adyen', 'resend'] as const
