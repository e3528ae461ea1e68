import { context, propagation, type TextMapSetter } from '@opentelemetry/api'
import { GatewayUnreachable, ProblemError } from './errors.js'

const intoHeaders: TextMapSetter<Headers> = { set: (headers, name, value) => headers.set(name, value) }

/**
 * The fetch the SDK uses: the global one by default, or one injected (a proxy, a test's recorder).
 *
 * @example
 * new FencegateClient({ baseUrl, fetch: (input, init) => fetch(input, { ...init, dispatcher }) })
 */
export type FetchLike = (input: string | URL | Request, init?: RequestInit) => Promise<Response>

export interface JsonAnswer {
  status: number
  body: Record<string, unknown> | undefined
  /** The answer's `Retry-After` in milliseconds, when it gives one in seconds. */
  retryAfterMs?: number
}

/** The local monotonic clock, in milliseconds. Lease deadlines use only this, never Date. */
export const monotonic = (): number => performance.now()

/** An AbortSignal that aborts after `ms` or when `parent` aborts, whichever comes first; `clear` frees the timer. */
export function deadlineSignal(ms: number, parent?: AbortSignal): { signal: AbortSignal; clear: () => void } {
  const controller = new AbortController()
  const timer = setTimeout(() => controller.abort(new DOMException('the call took longer than its deadline', 'TimeoutError')), ms)
  const onParent = () => controller.abort(parent!.reason)
  if (parent?.aborted) controller.abort(parent.reason)
  else parent?.addEventListener('abort', onParent, { once: true })
  return {
    signal: controller.signal,
    clear: () => {
      clearTimeout(timer)
      parent?.removeEventListener('abort', onParent)
    },
  }
}

/** Waits `ms` (a retry pause), or less if `signal` aborts. */
export function pause(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve()
    const done = () => {
      clearTimeout(timer)
      signal?.removeEventListener('abort', done)
      resolve()
    }
    const timer = setTimeout(done, ms)
    signal?.addEventListener('abort', done, { once: true })
  })
}

/** Calls the job API: JSON in, JSON out, a deadline per call. Network failures and timeouts become GatewayUnreachable. */
export class JobApi {
  constructor(private readonly baseUrl: string, private readonly token: string | undefined, readonly fetch: FetchLike) {}

  /**
   * Adds the bearer token to requests for the gateway's own origin, never to other hosts, and the
   * worker's trace context (`traceparent`, `tracestate`) from the active OpenTelemetry context,
   * unless the caller set its own. Without an OpenTelemetry SDK registered in the worker's
   * process the global propagator is a no-op and nothing is added.
   */
  authorize(url: string, headers: Headers): void {
    if (!headers.has('traceparent')) propagation.inject(context.active(), headers, intoHeaders)
    if (this.token && !headers.has('authorization') && new URL(url).origin === new URL(this.baseUrl).origin) {
      headers.set('authorization', `Bearer ${this.token}`)
    }
  }

  async call(method: 'GET' | 'POST', path: string, body: unknown, timeoutMs: number, signal?: AbortSignal): Promise<JsonAnswer> {
    const url = `${this.baseUrl.replace(/\/+$/, '')}/_fencegate/jobs${path}`
    const headers = new Headers({ accept: 'application/json' })
    if (body !== undefined) headers.set('content-type', 'application/json')
    this.authorize(url, headers)
    const deadline = deadlineSignal(timeoutMs, signal)
    try {
      const res = await this.fetch(url, { method, headers, signal: deadline.signal, ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
      const text = await res.text()
      let parsed: Record<string, unknown> | undefined
      try {
        parsed = text ? (JSON.parse(text) as Record<string, unknown>) : undefined
      } catch {
        parsed = undefined
      }
      const retryAfter = res.headers.get('retry-after')
      return { status: res.status, body: parsed, ...(retryAfter !== null && /^\d{1,6}$/.test(retryAfter) ? { retryAfterMs: Number(retryAfter) * 1000 } : {}) }
    } catch (err) {
      throw new GatewayUnreachable(`${method} ${path}`, err)
    } finally {
      deadline.clear()
    }
  }

  /** Like call, but any answer outside 2xx becomes a ProblemError. */
  async ok(method: 'GET' | 'POST', path: string, body: unknown, timeoutMs: number, signal?: AbortSignal): Promise<JsonAnswer> {
    const answer = await this.call(method, path, body, timeoutMs, signal)
    if (answer.status >= 200 && answer.status < 300) return answer
    throw problemOf(answer)
  }
}

export function problemOf(answer: JsonAnswer): ProblemError {
  const code = typeof answer.body?.code === 'string' ? answer.body.code : `http_${answer.status}`
  return new ProblemError(answer.status, code, answer.body ?? {})
}
