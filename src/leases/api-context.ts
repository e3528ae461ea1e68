import type { Config, JobType } from '../config/schema.js'
import type { Answer } from '../http/exchange.js'
import type { Identity } from '../http/identity.js'
import type { Inbound } from '../http/inbound.js'
import type { Logger } from '../observe/log.js'
import type { Metrics } from '../observe/metrics.js'
import type { JobStore } from './store.js'
import type { ClaimWake } from './wake.js'

// What each job route (src/leases/api.ts, api-claim.ts) is handed, and how it answers.

/** One request as a job route sees it. */
export interface JobCall {
  request: Inbound
  requestId: string
  identity: Identity
  /** The job id in the path, checked (`job_not_found` when it cannot be one). */
  jobId: string
  /** The trace of the call, for the audit rows it writes; null when untraced. */
  traceId: string | null
  /** What the call's SERVER span will show; undefined unless the span is sampled, so an untraced call writes nothing. */
  notes?: JobSpanNotes | undefined
}

/**
 * What a job route learned for its call's SERVER span (`endJobSpan`, src/gateway/spans.ts):
 * identifiers and outcomes only, never a payload, a result or an error text.
 */
export interface JobSpanNotes {
  /** The job acted on when the path does not name it: a one-job claim's. */
  jobId?: string
  /** The fence presented (heartbeat, append, complete, fail, release) or issued (a one-job claim). */
  fence?: string
  /** How many jobs a claim with `max` took (its ids are left out: up to 100 of them). */
  count?: number
  /** What became of the lease; a refusal's outcome is its problem code, set where the span ends. */
  outcome?: LeaseOutcome
}

export type LeaseOutcome = 'claimed' | 'none' | 'renewed' | 'appended' | 'completed' | 'failed' | 'released'

/** Notes the lease's outcome on a sampled call's span; a string constant, so nothing is allocated when untraced. */
export function noteOutcome(call: JobCall, outcome: LeaseOutcome): void {
  if (call.notes) call.notes.outcome = outcome
}

/** The shared pieces every job route uses. */
export interface JobsContext {
  config: Config
  jobs: JobStore
  log: Logger
  metrics: Metrics
  wake: ClaimWake
  typesFor(names: string[] | undefined): JobType[]
  /** The largest body read, `server.max_request_body`. */
  limit: number
}

export type JobRoute = (ctx: JobsContext, call: JobCall) => Promise<Answer>

/**
 * A JSON answer, with the request id every answer carries.
 *
 * @example
 * return jsonAnswer(200, { job_id: '7', state: 'succeeded' }, requestId)
 */
export function jsonAnswer(status: number, value: unknown, requestId: string): Answer {
  const headers = new Headers({ 'content-type': 'application/json', 'x-request-id': requestId })
  return { status, headers, body: encoder.encode(JSON.stringify(value)) }
}

/** No content: a claim that found no job. */
export function noContent(requestId: string): Answer {
  return { status: 204, headers: new Headers({ 'x-request-id': requestId }), body: null }
}

const encoder = new TextEncoder()
