import type { Answer } from '../http/exchange.js'
import type { HeaderList } from '../http/header-list.js'
import type { BodySource, Inbound } from '../http/inbound.js'
import { FencegateError } from '../http/problems.js'
import type { Held } from '../store/store.js'
import { attestationHeader, attestCommand } from './attest.js'
import type { PipelineContext } from './context.js'
import { fenceHeader } from './fence.js'
import { keyHeaderValue } from './idempotency.js'
import { ForwardError, upstreamRequestHeaders } from './forward.js'
import { logged } from './outcome.js'
import { forwardFailureRetry } from './retry-hint.js'
import { endUpstreamSpan, startUpstreamSpan } from './spans.js'
import type { Route } from './route.js'
import { addElapsed, type Trace } from './trace.js'

/** What goes upstream: the request, its body (buffered or streaming) and the key held for it, if any. */
export interface Outgoing {
  request: Inbound
  url: URL
  route: Route
  body: BodySource
  /** True once a streamed body passed the size limit (the forward then failed because of it). */
  bodyExceeded: () => boolean
  held: Held | undefined
}

/** The headers the upstream gets: filtered, the route's own, the decision headers as read; no attestation yet. */
function outgoingHeaders(o: Outgoing, trace: Trace): HeaderList {
  const { request, route } = o
  const headers = upstreamRequestHeaders(request.headers)
  headers.set('x-request-id', trace.requestId)
  // The caller's credentials are for fencegate; the upstream gets the route's own unless told otherwise.
  if (!route.config.forward_authorization) headers.delete('authorization')
  for (const [name, value] of Object.entries(route.config.upstream_headers)) headers.set(name, value)
  // Re-set after filtering: a client naming them in `Connection` must not hide from the upstream
  // the fence, or a header the entity, the claimed tenant or the key was read from.
  for (const name of [fenceHeader, ...route.decisionHeaders]) {
    const value = request.headers.get(name)
    if (value !== null) headers.set(name, value)
  }
  // tenant_scoped: the header the key was read from (config allows it only for a one-header key).
  if (trace.upstreamKey && route.keyHeader) headers.set(route.keyHeader, trace.upstreamKey)
  // Else the key in one form: `"pay-77"` and `pay-77` are one key here, and must be one upstream too.
  else if (trace.key !== undefined && route.keyHeader) headers.set(route.keyHeader, keyHeaderValue(trace.key))
  // Last, so that no client header (not even one re-set above) can pass for the gateway's attestation.
  headers.delete(attestationHeader)
  return headers
}

/** Signs a fenced command for a route with `attest` (the only step here that awaits). */
async function attest(ctx: PipelineContext, o: Outgoing, trace: Trace, headers: HeaderList): Promise<void> {
  try {
    headers.set(attestationHeader, await attestCommand(ctx.attest, trace, o.url, o.route.config))
  } catch (err) {
    // Nothing was sent: the key is free for the next attempt.
    if (o.held) await logged(ctx.log, trace.requestId, 'release', () => ctx.store.release(o.held!))
    throw err
  }
}

/**
 * Forwards to the route's upstream (the target path is the one that matched), adding the
 * time to the trace's `upstreamMs`. A failure settles the held key first: nothing sent
 * frees it, possibly sent marks its outcome unknown.
 */
export async function forwardUpstream(ctx: PipelineContext, o: Outgoing, trace: Trace): Promise<Answer> {
  const { route, held } = o
  const started = performance.now()
  const headers = outgoingHeaders(o, trace)
  if (route.config.attest && trace.fence !== undefined) await attest(ctx, o, trace, headers)
  const target = o.url.pathname + o.url.search
  // One attempt, one CLIENT span; its context replaces the caller's traceparent in `headers`.
  const span = startUpstreamSpan(ctx.tracing, trace.span!, route.config, o.request.method, target, headers)
  try {
    const answer = await ctx.forward({ route: route.config, target, method: o.request.method, headers, body: o.body })
    endUpstreamSpan(span, answer.status)
    return answer
  } catch (err) {
    const exceeded = o.bodyExceeded()
    span.end(exceeded ? 'body_too_large' : err instanceof ForwardError ? err.kind : (err as Error)?.name ?? 'error')
    if (exceeded) throw new FencegateError('body_too_large', `the request body exceeds ${ctx.bodyLimit} bytes`)
    if (!(err instanceof ForwardError)) throw err
    if (held) await logged(ctx.log, trace.requestId, err.sent ? 'mark_unknown' : 'release', () => (err.sent ? ctx.store.markUnknown(held) : ctx.store.release(held)))
    // Not transient: the same certificates fail the same way until an operator changes them.
    if (err.kind === 'tls') throw new FencegateError('upstream_tls_failed', 'the TLS handshake with the upstream failed (its certificate, its name, or the client certificate was refused); nothing was sent')
    const retry = forwardFailureRetry({ sent: err.sent, keyed: held !== undefined, upstreamDedupesKeys: route.config.upstream_dedupes_keys })
    if (err.kind === 'timeout') throw new FencegateError('upstream_timeout', `the upstream did not answer within ${route.config.timeout_ms} ms`, {}, retry)
    throw new FencegateError('upstream_unreachable', err.sent
      ? 'the connection to the upstream failed after the request was sent; its outcome is unknown'
      : 'the upstream refused or could not be reached; nothing was sent', {}, retry)
  } finally {
    addElapsed(trace, 'upstreamMs', started)
  }
}
