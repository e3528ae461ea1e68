import { Hono } from 'hono'
import { z } from 'zod'
import { readBody } from '../http/body.js'
import type { Config, JobType } from '../config/schema.js'
import type { Authenticate, Identity } from '../http/identity.js'
import type { Logger } from '../observe/log.js'
import { noMetrics, type Metrics } from '../observe/metrics.js'
import { FencegateError } from '../http/problems.js'
import { maxBulkStart, maxClaimBatch, type Claimed, type Holder, type JobStore, type Started } from './store.js'
import { createClaimWake, type ClaimWake } from './wake.js'

/** The reserved prefix the job API lives under; no route may claim it. */
export const jobsPath = '/_fencegate/jobs'

const id = z.string().min(1).max(255)
const startBody = z.object({ type: z.string(), key: id, payload: z.unknown().optional(), restart: z.boolean().optional() }).strict()
const bulkStartBody = z.object({ jobs: z.array(startBody).min(1).max(maxBulkStart) }).strict()
const claimBody = z.object({
  worker_id: id, types: z.array(z.string()).min(1).optional(), wait: z.number().min(0).max(30).optional(),
  max: z.number().int().min(1).max(maxClaimBatch).optional(),
}).strict()
const holderBody = z.object({ worker_id: id, fence: z.string().regex(/^(0|[1-9][0-9]{0,18})$/) })
const appendBody = holderBody.extend({ seq: z.number().int().min(0).max(1_000_000), chunk: z.unknown() }).strict()
const completeBody = holderBody.extend({ result: z.unknown().optional() }).strict()
const failBody = holderBody.extend({ error: z.unknown().optional(), retryable: z.boolean() }).strict()

type Env = { Variables: { requestId: string } }

function isStorableJson(value: unknown): boolean {
  if (typeof value === 'string') return value.isWellFormed() && !value.includes('\u0000')
  if (Array.isArray(value)) return value.every(isStorableJson)
  if (value && typeof value === 'object') return Object.entries(value).every(([k, v]) => isStorableJson(k) && isStorableJson(v))
  return true
}

/**
 * The lease service: jobs that only one live owner may run, renew and finish.
 * Every decision is one statement on the database clock (src/leases/store.ts);
 * the tenant always comes from the caller's identity.
 *
 * @example
 * app.route(jobsPath, createJobsApp({ config, jobs: createJobStore(db), authenticate, log }))
 */
export function createJobsApp(deps: { config: Config; jobs: JobStore; authenticate: Authenticate; log: Logger; wake?: ClaimWake | undefined; metrics?: Metrics | undefined }) {
  const { config, jobs, authenticate, log } = deps
  const metrics = deps.metrics ?? noMetrics
  const wake = deps.wake ?? createClaimWake({ listen: jobs.listenForWork, log })
  const types = new Map(config.job_types.map((t) => [t.name, t]))
  const app = new Hono<Env>()

  async function json<S extends z.ZodType>(request: Request, schema: S): Promise<z.output<S>> {
    const bytes = await readBody(request, config.server.max_request_body)
    let value: unknown
    try {
      value = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes))
    } catch {
      throw new FencegateError('invalid_request', 'the body must be JSON')
    }
    // PostgreSQL's text and jsonb refuse NUL and lone surrogates: a client mistake, not a store failure.
    if (!isStorableJson(value)) throw new FencegateError('invalid_request', 'the body contains control characters or invalid Unicode in a string')
    const parsed = schema.safeParse(value)
    if (!parsed.success) {
      const issue = parsed.error.issues[0]!
      throw new FencegateError('invalid_request', `${issue.path.join('.') || 'body'}: ${issue.message}`)
    }
    return parsed.data
  }
  const typesFor = (names: string[] | undefined): JobType[] => {
    if (!names) return config.job_types
    return names.map((n) => {
      const t = types.get(n)
      if (!t) throw new FencegateError('unknown_job_type', `no job type ${JSON.stringify(n)} is configured`)
      return t
    })
  }
  const jobIdOf = (raw: string) => {
    if (!/^[1-9][0-9]{0,17}$/.test(raw)) throw new FencegateError('job_not_found', 'no such job')
    return raw
  }
  const holder = (identity: Identity, jobId: string, body: { worker_id: string; fence: string }): Holder =>
    ({ tenant: identity.tenant, jobId, workerId: body.worker_id, fence: body.fence })
  const lost = async (h: Holder, code: 'lease_lost' | 'not_owner' = 'lease_lost') => {
    const reason = await jobs.lostReason(h)
    if (reason === 'not_found') return new FencegateError('job_not_found', 'no such job')
    log.info(code === 'not_owner' ? 'result_rejected' : 'heartbeat_lost', { job_id: h.jobId, fence: h.fence, reason })
    if (code === 'not_owner') metrics.resultRejected({ reason })
    return new FencegateError(code, `this worker and fence no longer hold the job (${reason})`, { reason })
  }

  app.post('/', async (c) => {
    const identity = await authenticate(c.req.raw)
    const body = await json(c.req.raw, startBody)
    typesFor([body.type])
    const job = await jobs.startJob({ tenant: identity.tenant, type: body.type, key: body.key, payload: body.payload, restart: body.restart ?? false })
    if (job.created) return c.json({ job_id: job.job_id, state: job.state, created: true }, 201)
    if (job.state === 'succeeded') return c.json({ job_id: job.job_id, state: job.state, result: job.result })
    if (job.state === 'failed' || job.state === 'cancelled') {
      throw new FencegateError('job_finished', `the job is ${job.state}; start it with "restart": true to run it again`, { job_id: job.job_id, state: job.state })
    }
    return c.json({ job_id: job.job_id, state: job.state, joined: true })
  })

  // Starts up to maxBulkStart jobs in one statement; each answer says what a single start would have.
  app.post('/bulk', async (c) => {
    const identity = await authenticate(c.req.raw)
    const body = await json(c.req.raw, bulkStartBody)
    const seen = new Map<string, number>()
    body.jobs.forEach((j, i) => {
      typesFor([j.type])
      const k = JSON.stringify([j.type, j.key])
      if (seen.has(k)) throw new FencegateError('invalid_request', `jobs.${i}: repeats the type and key of jobs.${seen.get(k)}`)
      seen.set(k, i)
    })
    const started = await jobs.startJobs(identity.tenant, body.jobs.map((j) => ({ type: j.type, key: j.key, payload: j.payload, restart: j.restart ?? false })))
    const answer = (s: Started) => {
      if (s.created) return { job_id: s.job_id, state: s.state, created: true }
      if (s.state === 'succeeded') return { job_id: s.job_id, state: s.state, result: s.result }
      if (s.state === 'failed' || s.state === 'cancelled') return { job_id: s.job_id, state: s.state, code: 'job_finished' }
      return { job_id: s.job_id, state: s.state, joined: true }
    }
    return c.json({ jobs: started.map(answer) })
  })

  app.post('/claim', async (c) => {
    const identity = await authenticate(c.req.raw)
    const body = await json(c.req.raw, claimBody)
    const wanted = typesFor(body.types)
    const claimRound = async (): Promise<Claimed[]> => {
      // Jobs out of attempts are finished by the claim itself; keep going so they never block the queue.
      for (let i = 0; i < 100; i++) {
        const request = { tenant: identity.tenant, workerId: body.worker_id, types: wanted }
        // claimOne keeps its own store-call metric (call="claimOne") for one-job claims.
        const all = body.max === undefined ? [await jobs.claimOne(request)].filter((one) => one !== undefined) : await jobs.claimJobs({ ...request, max: body.max })
        if (all.length === 0) return []
        const claimed = all.filter((one) => one.state === 'running')
        if (claimed.length === 0) continue
        for (const one of claimed) {
          log.info('job_claimed', { job_id: one.job_id, fence: one.fence, attempt: one.attempt })
          metrics.jobClaimed({ type: one.type, reclaimed: one.reclaimed })
        }
        return claimed
      }
      return []
    }
    // With `max`, the answer is a list (`{"jobs": [...]}`); without it, the one job itself, as before.
    const answer = (claimed: Claimed[]) => {
      if (claimed.length === 0) return undefined
      const shown = claimed.map(({ state: _state, reclaimed: _reclaimed, ...one }) => one)
      return c.json(body.max === undefined ? shown[0]! : { jobs: shown })
    }
    if (!body.wait) return answer(await claimRound()) ?? c.body(null, 204)
    // The deadline is a request timeout, so the process's monotonic clock is right for it;
    // whether a job is due or a lease expired is decided by the claim statement on the database clock.
    const deadline = performance.now() + body.wait * 1000
    const signal = c.req.raw.signal
    const waiter = await wake.register(wanted.map((t) => t.name), deadline)
    try {
      for (;;) {
        const claimed = answer(await claimRound())
        if (claimed) return claimed
        const why = await waiter.next(deadline, signal)
        // A client that left gets no job: a claim nobody reads would only burn an attempt.
        if (why === 'aborted') return c.body(null, 204)
        // One last look at the deadline, then nothing.
        if (why === 'deadline') return answer(await claimRound()) ?? c.body(null, 204)
      }
    } finally {
      waiter.release()
    }
  })

  app.get('/:id', async (c) => {
    const identity = await authenticate(c.req.raw)
    const jobId = jobIdOf(c.req.param('id'))
    const job = await jobs.getJob(identity.tenant, jobId)
    if (!job) throw new FencegateError('job_not_found', 'no such job')
    const from = c.req.query('from')
    if (from === undefined) return c.json(job)
    if (!/^\d{1,7}$/.test(from)) throw new FencegateError('invalid_query', 'from must be a chunk number', { parameter: 'from' })
    return c.json({ ...job, from: Number(from), chunks: await jobs.chunksFrom(jobId, Number(from)) })
  })

  app.post('/:id/heartbeat', async (c) => {
    const identity = await authenticate(c.req.raw)
    const h = holder(identity, jobIdOf(c.req.param('id')), await json(c.req.raw, holderBody.strict()))
    const renewed = await jobs.heartbeat(h, config.job_types)
    if (renewed) {
      log.debug('heartbeat_ok', { job_id: h.jobId, fence: h.fence })
      const { type, lease_left_ms, ...answer } = renewed
      metrics.heartbeat({ type, ageMs: Math.max(0, answer.lease_ms - lease_left_ms), remainingMs: Math.max(0, lease_left_ms) })
      return c.json(answer)
    }
    if (await jobs.failOverRuntime(h, config.job_types)) {
      metrics.renewalFailed({ reason: 'max_runtime' })
      throw new FencegateError('lease_lost', 'the job ran past max_runtime and was failed', { reason: 'max_runtime' })
    }
    const refused = await lost(h)
    metrics.renewalFailed({ reason: refused.code === 'job_not_found' ? 'not_found' : String(refused.extras.reason) })
    throw refused
  })

  app.post('/:id/append', async (c) => {
    const identity = await authenticate(c.req.raw)
    const body = await json(c.req.raw, appendBody)
    const h = holder(identity, jobIdOf(c.req.param('id')), body)
    const r = await jobs.append(h, body.seq, body.chunk)
    if (!r.live) throw await lost(h)
    if (r.inserted || r.same) return c.json({ seq: body.seq, cursor_length: r.cursor_length })
    throw new FencegateError('sequence_conflict', `the next chunk is ${r.cursor_length}; seq ${body.seq} is a gap or differs from the stored chunk`, { cursor_length: r.cursor_length ?? 0 })
  })

  app.post('/:id/complete', async (c) => {
    const identity = await authenticate(c.req.raw)
    const body = await json(c.req.raw, completeBody)
    const h = holder(identity, jobIdOf(c.req.param('id')), body)
    const r = await jobs.complete(h, body.result, { requestId: c.get('requestId'), caller: identity.caller, path: c.req.path })
    if (r.completed || r.repeated) return c.json({ job_id: h.jobId, state: 'succeeded' })
    throw await lost(h, 'not_owner')
  })

  app.post('/:id/fail', async (c) => {
    const identity = await authenticate(c.req.raw)
    const body = await json(c.req.raw, failBody)
    const h = holder(identity, jobIdOf(c.req.param('id')), body)
    const r = await jobs.fail(h, config.job_types, body.error, body.retryable)
    if (r) return c.json({ job_id: h.jobId, state: r.state })
    throw await lost(h)
  })

  app.post('/:id/release', async (c) => {
    const identity = await authenticate(c.req.raw)
    const h = holder(identity, jobIdOf(c.req.param('id')), await json(c.req.raw, holderBody.strict()))
    const r = await jobs.release(h)
    if (!r) throw await lost(h)
    log.info('job_released', { job_id: h.jobId, fence: h.fence, state: r.state })
    metrics.jobReleased({ type: r.type })
    return c.json({ job_id: h.jobId, state: r.state })
  })

  app.post('/:id/cancel', async (c) => {
    const identity = await authenticate(c.req.raw)
    const jobId = jobIdOf(c.req.param('id'))
    const r = await jobs.cancel(identity.tenant, jobId)
    if (r) return c.json({ job_id: jobId, state: r.state, cancel_requested: true })
    const job = await jobs.getJob(identity.tenant, jobId)
    if (!job) throw new FencegateError('job_not_found', 'no such job')
    throw new FencegateError('job_finished', `the job is ${job.state}`, { state: job.state })
  })

  return app
}
