import type { Config } from '../config/schema.js'
import type { Answer } from '../http/exchange.js'
import type { Authenticate } from '../http/identity.js'
import type { Rejection } from '../store/audit.js'
import type { Inbound } from '../http/inbound.js'
import { FencegateError } from '../http/problems.js'
import type { Logger } from '../observe/log.js'
import { noMetrics, type Metrics } from '../observe/metrics.js'
import { appendBody, bulkStartBody, completeBody, failBody, holderBody, jsonBody, startBody } from './api-body.js'
import { claimHandler } from './api-claim.js'
import { jsonAnswer, noteOutcome, type JobCall, type JobRoute, type JobSpanNotes, type JobsContext } from './api-context.js'
import type { Holder, JobStore, Started } from './store.js'
import { createClaimWake, type ClaimWake } from './wake.js'
import { jobScopes, requireJobScope, workerOf, type JobScope } from './api-identity.js'

/** The reserved prefix the job API lives under; no route may claim it. */
export const jobsPath = '/_fencegate/jobs'

/** What the job API is built from. */
export interface JobsApiDeps {
  config: Config
  jobs: JobStore
  authenticate: Authenticate
  log: Logger
  wake?: ClaimWake | undefined
  metrics?: Metrics | undefined
  /** Writes the audit row of a caller refused for its scope or its worker (the Store's `recordRejection`). */
  audit?: ((rejection: Rejection) => Promise<void>) | undefined
}

/**
 * The job API's handler: an answer, or undefined when no job route matches (the caller's router
 * goes on). `scope` replaces the statements and the logger for this call (a traced call's spans and log ids),
 * names its trace for the audit rows it writes, and takes the notes for a sampled call's span.
 */
export type JobsApi = (request: Inbound, requestId: string, scope?: { jobs: JobStore; log: Logger; traceId?: string | null; notes?: JobSpanNotes | undefined }) => Promise<Answer | undefined>


/**
 * The lease service over plain requests and answers: jobs that only one live owner may run,
 * renew and finish. Every decision is one statement on the database clock
 * (src/leases/store.ts); the tenant always comes from the caller's identity. It is routed
 * before the command pipeline, on Node straight off the socket like commands are.
 *
 * @example
 * const jobsApi = createJobsApi({ config, jobs: createJobStore(db), authenticate, log })
 * const answer = await jobsApi(webInbound(new Request('http://gw/_fencegate/jobs/claim', init)), requestId)
 */
export function createJobsApi(deps: JobsApiDeps): JobsApi {
  const { config, jobs, authenticate, log } = deps
  const types = new Map(config.job_types.map((t) => [t.name, t]))
  const ctx: JobsContext = {
    config, jobs, log, metrics: deps.metrics ?? noMetrics, limit: config.server.max_request_body,
    wake: deps.wake ?? createClaimWake({ listen: jobs.listenForWork, log, maxWaitingPerTenant: config.job_waiting_claims }),
    typesFor: (names) => {
      if (!names) return config.job_types
      // A type named twice is one scan, not two.
      return [...new Set(names)].map((n) => {
        const t = types.get(n)
        if (!t) throw new FencegateError('unknown_job_type', `no job type ${JSON.stringify(n)} is configured`)
        return t
      })
    },
  }
  return async (request, requestId, scope) => {
    const found = routeOf(request.method, request.url.pathname)
    if (!found) return undefined
    const identity = await authenticate(request)
    const jobId = found.id === undefined ? '' : jobIdOf(found.id)
    const call: JobCall = { request, requestId, identity, jobId, traceId: scope?.traceId ?? null, notes: scope?.notes }
    try {
      return await found.route(scope ? { ...ctx, jobs: scope.jobs, log: scope.log } : ctx, call)
    } catch (err) {
      if (err instanceof FencegateError && refusedCaller.has(err.code)) await auditRefusal(deps, err.code, call)
      throw err
    }
  }
}

/** Refusals of who the caller is, audited: a token used beyond its scope or for another worker. */
const refusedCaller: ReadonlySet<string> = new Set(['insufficient_scope', 'worker_mismatch'])

async function auditRefusal(deps: JobsApiDeps, code: string, { request, requestId, identity, jobId, traceId }: JobCall): Promise<void> {
  try {
    await deps.audit?.({
      tenant: identity.tenant, route: null, entity: jobId ? `job:${jobId}` : null, code, presentedFence: null, highestFence: null,
      method: request.method, path: request.url.pathname, bodySha256: null, caller: identity.caller, requestId, traceId,
    })
  } catch {
    // The refusal stands without its row; the store's failure is logged where it is seen next.
    deps.log.warn('audit_failed', { request_id: requestId, code })
  }
}

/** A route that first requires its scope (src/leases/api-identity.ts). */
const scoped = (scope: JobScope, route: JobRoute): JobRoute => (ctx, call) => {
  requireJobScope(call.identity, scope)
  return route(ctx, call)
}

// Method and path to route: Maps, so no path can reach an Object.prototype member.
const collection = new Map<string, Map<string, JobRoute>>([
  ['', new Map([['POST', scoped(jobScopes.start, start)]])],
  ['/bulk', new Map([['POST', scoped(jobScopes.start, startMany)]])],
  ['/claim', new Map([['POST', scoped(jobScopes.work, claimHandler)]])],
])
const perJob = new Map<string, Map<string, JobRoute>>([
  ['', new Map([['GET', scoped(jobScopes.read, view)], ['HEAD', scoped(jobScopes.read, view)]])],
  ['/heartbeat', new Map([['POST', scoped(jobScopes.work, heartbeat)]])],
  ['/append', new Map([['POST', scoped(jobScopes.work, append)]])],
  ['/complete', new Map([['POST', scoped(jobScopes.work, complete)]])],
  ['/fail', new Map([['POST', scoped(jobScopes.work, fail)]])],
  ['/release', new Map([['POST', scoped(jobScopes.work, release)]])],
  ['/cancel', new Map([['POST', scoped(jobScopes.cancel, cancel)]])],
])

/** A job API route as its span names it (src/gateway/spans.ts `endJobSpan`). */
export interface JobSpanRoute {
  /** `/_fencegate/jobs/{job_id}/heartbeat`: never the raw path. */
  template: string
  /** The job id as written in the path, when the route has one. */
  id?: string
  /** It takes or holds a lease, so a refusal's code is the lease's outcome too. */
  lease: boolean
}

// The routes a lease is claimed or presented on; `/cancel` is the operator's and holds none.
const leaseVerbs = new Set(['/claim', '/heartbeat', '/append', '/complete', '/fail', '/release'])

/**
 * The job API's route a request is for, as a template (`/_fencegate/jobs/{job_id}/heartbeat`),
 * with the job id as written in the path; undefined when it is none of them. For span names.
 *
 * @example
 * jobRouteOf('POST', '/_fencegate/jobs/42/heartbeat') // { template: '/_fencegate/jobs/{job_id}/heartbeat', id: '42', lease: true }
 */
export function jobRouteOf(method: string, pathname: string): JobSpanRoute | undefined {
  const found = routeOf(method, pathname)
  if (!found) return undefined
  if (found.id === undefined) return { template: pathname, lease: leaseVerbs.has(pathname.slice(jobsPath.length)) }
  const verb = pathname.slice(jobsPath.length + 1 + found.id.length)
  return { template: `${jobsPath}/{job_id}${verb}`, id: found.id, lease: leaseVerbs.has(verb) }
}

/** `/_fencegate/jobs`, `/bulk`, `/claim`, then `/:id` and `/:id/<verb>`; exact paths, no trailing slash. */
function routeOf(method: string, pathname: string): { route: JobRoute; id?: string } | undefined {
  if (!pathname.startsWith(jobsPath)) return undefined
  const rest = pathname.slice(jobsPath.length)
  const fixed = collection.get(rest)?.get(method)
  if (fixed) return { route: fixed }
  const match = /^\/([^/]+)(\/[a-z]+)?$/.exec(rest)
  const route = match && perJob.get(match[2] ?? '')?.get(method)
  return route ? { route, id: match![1]! } : undefined
}

function jobIdOf(segment: string): string {
  let raw: string
  try {
    raw = decodeURIComponent(segment)
  } catch {
    throw new FencegateError('job_not_found', 'no such job')
  }
  if (!/^[1-9][0-9]{0,17}$/.test(raw)) throw new FencegateError('job_not_found', 'no such job')
  return raw
}

async function start(ctx: JobsContext, { request, requestId, identity }: JobCall): Promise<Answer> {
  const body = await jsonBody(request, startBody, ctx.limit)
  ctx.typesFor([body.type])
  const job = await ctx.jobs.startJob({ tenant: identity.tenant, type: body.type, key: body.key, payload: body.payload, restart: body.restart ?? false })
  if (job.created) return jsonAnswer(201, { job_id: job.job_id, state: job.state, created: true }, requestId)
  if (job.state === 'succeeded') return jsonAnswer(200, { job_id: job.job_id, state: job.state, result: job.result }, requestId)
  if (job.state === 'failed' || job.state === 'cancelled') {
    throw new FencegateError('job_finished', `the job is ${job.state}; start it with "restart": true to run it again`, { job_id: job.job_id, state: job.state })
  }
  return jsonAnswer(200, { job_id: job.job_id, state: job.state, joined: true }, requestId)
}

// Starts up to maxBulkStart jobs in one statement; each answer says what a single start would have.
async function startMany(ctx: JobsContext, { request, requestId, identity }: JobCall): Promise<Answer> {
  const body = await jsonBody(request, bulkStartBody, ctx.limit)
  const seen = new Map<string, number>()
  body.jobs.forEach((j, i) => {
    ctx.typesFor([j.type])
    const k = JSON.stringify([j.type, j.key])
    if (seen.has(k)) throw new FencegateError('invalid_request', `jobs.${i}: repeats the type and key of jobs.${seen.get(k)}`)
    seen.set(k, i)
  })
  const started = await ctx.jobs.startJobs(identity.tenant, body.jobs.map((j) => ({ type: j.type, key: j.key, payload: j.payload, restart: j.restart ?? false })))
  const answer = (s: Started) => {
    if (s.created) return { job_id: s.job_id, state: s.state, created: true }
    if (s.state === 'succeeded') return { job_id: s.job_id, state: s.state, result: s.result }
    if (s.state === 'failed' || s.state === 'cancelled') return { job_id: s.job_id, state: s.state, code: 'job_finished' }
    return { job_id: s.job_id, state: s.state, joined: true }
  }
  return jsonAnswer(200, { jobs: started.map(answer) }, requestId)
}

async function view(ctx: JobsContext, { request, requestId, identity, jobId }: JobCall): Promise<Answer> {
  const job = await ctx.jobs.getJob(identity.tenant, jobId)
  if (!job) throw new FencegateError('job_not_found', 'no such job')
  const from = request.url.searchParams.get('from')
  if (from === null) return jsonAnswer(200, job, requestId)
  if (!/^\d{1,7}$/.test(from)) throw new FencegateError('invalid_query', 'from must be a chunk number', { parameter: 'from' })
  return jsonAnswer(200, { ...job, from: Number(from), chunks: await ctx.jobs.chunksFrom(jobId, Number(from)) }, requestId)
}

function holder(call: JobCall, body: { worker_id: string; fence: string }): Holder {
  // Noted before any statement, so a refused call's span shows the fence it presented.
  if (call.notes) call.notes.fence = body.fence
  // The token's sub (null without auth) is compared exactly with the one the claim recorded: the worker id's prefix proves nothing.
  return { tenant: call.identity.tenant, jobId: call.jobId, workerId: workerOf(call.identity, body.worker_id), fence: body.fence, sub: call.identity.caller }
}

/** Why a holder statement changed nothing, as the problem to answer (and a log line and metric). */
async function lost(ctx: JobsContext, h: Holder, code: 'lease_lost' | 'not_owner' = 'lease_lost'): Promise<FencegateError> {
  const reason = await ctx.jobs.lostReason(h)
  if (reason === 'not_found') return new FencegateError('job_not_found', 'no such job')
  if (reason === 'foreign') return new FencegateError('worker_mismatch', 'the lease is held under another token\'s sub; a worker id that starts with this sub and "/" is not this token\'s lease')
  ctx.log.info(code === 'not_owner' ? 'result_rejected' : 'heartbeat_lost', { job_id: h.jobId, fence: h.fence, reason })
  if (code === 'not_owner') ctx.metrics.resultRejected({ reason })
  return new FencegateError(code, `this worker and fence no longer hold the job (${reason})`, { reason })
}

async function heartbeat(ctx: JobsContext, call: JobCall): Promise<Answer> {
  const h = holder(call, await jsonBody(call.request, holderBody, ctx.limit))
  const renewed = await ctx.jobs.heartbeat(h, ctx.config.job_types)
  if (renewed) {
    ctx.log.debug('heartbeat_ok', { job_id: h.jobId, fence: h.fence })
    const { type, lease_left_ms, ...answer } = renewed
    ctx.metrics.heartbeat({ type, ageMs: Math.max(0, answer.lease_ms - lease_left_ms), remainingMs: Math.max(0, lease_left_ms) })
    noteOutcome(call, 'renewed')
    return jsonAnswer(200, answer, call.requestId)
  }
  if (await ctx.jobs.failOverRuntime(h, ctx.config.job_types)) {
    ctx.metrics.renewalFailed({ reason: 'max_runtime' })
    throw new FencegateError('lease_lost', 'the job ran past max_runtime and was failed', { reason: 'max_runtime' })
  }
  const refused = await lost(ctx, h)
  ctx.metrics.renewalFailed({ reason: refused.code === 'job_not_found' ? 'not_found' : String(refused.extras.reason) })
  throw refused
}

async function append(ctx: JobsContext, call: JobCall): Promise<Answer> {
  const body = await jsonBody(call.request, appendBody, ctx.limit)
  const h = holder(call, body)
  const r = await ctx.jobs.append(h, body.seq, body.chunk)
  if (!r.live) throw await lost(ctx, h)
  if (r.inserted || r.same) {
    noteOutcome(call, 'appended')
    return jsonAnswer(200, { seq: body.seq, cursor_length: r.cursor_length }, call.requestId)
  }
  throw new FencegateError('sequence_conflict', `the next chunk is ${r.cursor_length}; seq ${body.seq} is a gap or differs from the stored chunk`, { cursor_length: r.cursor_length ?? 0 })
}

async function complete(ctx: JobsContext, call: JobCall): Promise<Answer> {
  const body = await jsonBody(call.request, completeBody, ctx.limit)
  const h = holder(call, body)
  const r = await ctx.jobs.complete(h, body.result, { requestId: call.requestId, caller: call.identity.caller, path: call.request.url.pathname, traceId: call.traceId })
  if (r.completed || r.repeated) {
    noteOutcome(call, 'completed')
    return jsonAnswer(200, { job_id: h.jobId, state: 'succeeded' }, call.requestId)
  }
  throw await lost(ctx, h, 'not_owner')
}

async function fail(ctx: JobsContext, call: JobCall): Promise<Answer> {
  const body = await jsonBody(call.request, failBody, ctx.limit)
  const h = holder(call, body)
  const r = await ctx.jobs.fail(h, ctx.config.job_types, body.error, body.retryable)
  if (!r) throw await lost(ctx, h)
  // A retryable failure requeues the job, yet this lease ended the same way: failed.
  noteOutcome(call, 'failed')
  return jsonAnswer(200, { job_id: h.jobId, state: r.state }, call.requestId)
}

async function release(ctx: JobsContext, call: JobCall): Promise<Answer> {
  const h = holder(call, await jsonBody(call.request, holderBody, ctx.limit))
  const r = await ctx.jobs.release(h)
  if (!r) throw await lost(ctx, h)
  ctx.log.info('job_released', { job_id: h.jobId, fence: h.fence, state: r.state })
  ctx.metrics.jobReleased({ type: r.type })
  noteOutcome(call, 'released')
  return jsonAnswer(200, { job_id: h.jobId, state: r.state }, call.requestId)
}

async function cancel(ctx: JobsContext, { requestId, identity, jobId }: JobCall): Promise<Answer> {
  const r = await ctx.jobs.cancel(identity.tenant, jobId)
  if (r) return jsonAnswer(200, { job_id: jobId, state: r.state, cancel_requested: true }, requestId)
  const job = await ctx.jobs.getJob(identity.tenant, jobId)
  if (!job) throw new FencegateError('job_not_found', 'no such job')
  throw new FencegateError('job_finished', `the job is ${job.state}`, { state: job.state })
}
