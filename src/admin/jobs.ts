import { Hono } from 'hono'
import { z } from 'zod'
import { keysetPage, parseQuery, storeCall, tenantFor, tenantParam, type AdminEnv } from './query.js'
import { getJobDetail, listJobs, type JobSummary } from '../leases/list.js'
import { cancelAsOperator, releaseAsOperator, retryAsOperator, type OperatorAction, type OperatorResult } from '../leases/operator.js'
import { FencegateError } from '../http/problems.js'
import type { Db } from '../store/db.js'
import { traceIdOf } from '../observe/tracing.js'

/** `GET /jobs` query parameters. */
export const jobListQuerySchema = z.object({
  tenant: tenantParam,
  state: z.enum(['queued', 'running', 'succeeded', 'failed', 'cancelled']).optional().describe('Only jobs in this state'),
  type: z.string().regex(/^[\s\S]{1,255}$/, '1-255 characters').optional().describe('Only jobs of this type'),
  limit: z.string().regex(/^[0-9]{1,4}$/, 'an integer from 1 to 1000')
    .refine((v) => Number(v) >= 1 && Number(v) <= 1000, 'an integer from 1 to 1000').optional().describe('Page size, 1 to 1000 (default 100)'),
  before: z.string().regex(/^[0-9]{1,18}$/, 'a next_cursor value from an earlier page').optional().describe('The next_cursor of the previous page'),
}).strict()

/** The operator actions: each one's statement, and the problem when it finds nothing to act on. */
const actions: Record<string, { act: (db: Db, a: OperatorAction) => Promise<OperatorResult | undefined>; refusal: (state: string) => FencegateError }> = {
  cancel: { act: cancelAsOperator, refusal: (state) => new FencegateError('job_finished', `the job is ${state}`, { state }) },
  release: { act: releaseAsOperator, refusal: (state) => new FencegateError('job_not_running', `the job is ${state}: it has no lease to end`, { state }) },
  retry: { act: retryAsOperator, refusal: (state) => new FencegateError('job_not_retryable', `the job is ${state}: only a failed or cancelled job runs again`, { state }) },
}

const jobId = (id: string, tenant: string) => {
  if (!/^[0-9]{1,18}$/.test(id)) throw new FencegateError('job_not_found', `no job ${id} in tenant ${tenant}`)
  return id
}

/**
 * Job views and actions for operators (fencegate:admin): jobs by state and type
 * with each running job's holder, fence, attempt and remaining lease on the
 * database clock, and `POST /jobs/{id}/cancel`, `/release` (ends the lease now) and
 * `/retry` (a failed or cancelled job again), each audited with the operator as caller
 * (src/leases/operator.ts). Mounted at /jobs by createAdminApp when it has the Db.
 *
 * @example
 * app.route('/jobs', createAdminJobsApp(db))
 */
export function createAdminJobsApp(db: Db): Hono<AdminEnv> {
  const app = new Hono<AdminEnv>()

  app.get('/', async (c) => {
    const p = parseQuery(jobListQuerySchema, new URL(c.req.url).searchParams)
    const tenant = tenantFor(c.get('identity'), p.tenant, false) ?? 'default'
    const limit = p.limit === undefined ? 100 : Number(p.limit)
    const page = await storeCall(() => keysetPage<JobSummary>(limit, (n) => listJobs(db, { tenant, state: p.state, type: p.type, limit: n, before: p.before }), (item) => item.job_id))
    return c.json(page)
  })

  app.get('/:id', async (c) => {
    const p = parseQuery(z.object({ tenant: tenantParam }).strict(), new URL(c.req.url).searchParams)
    const tenant = tenantFor(c.get('identity'), p.tenant, false) ?? 'default'
    const id = c.req.param('id')
    if (!/^[0-9]{1,18}$/.test(id)) throw new FencegateError('not_found', `no job ${id} in tenant ${tenant}`)
    const job = await storeCall(() => getJobDetail(db, tenant, id))
    if (!job) throw new FencegateError('not_found', `no job ${id} in tenant ${tenant}`)
    return c.json(job)
  })

  for (const [name, { act, refusal }] of Object.entries(actions)) app.post(`/:id/${name}`, async (c) => {
    const p = parseQuery(z.object({ tenant: tenantParam }).strict(), new URL(c.req.url).searchParams)
    const tenant = tenantFor(c.get('identity'), p.tenant, false) ?? 'default'
    const id = jobId(c.req.param('id'), tenant)
    const done = await storeCall(() => act(db, { tenant, jobId: id, caller: c.get('identity').caller, requestId: c.get('requestId'), traceId: traceIdOf(c.get('span')) }))
    if (done) return c.json({ tenant, job_id: id, state: done.state, fence: done.fence })
    // Read after the fact, for the problem only: the statement above decided.
    const job = await storeCall(() => getJobDetail(db, tenant, id))
    if (!job) throw new FencegateError('job_not_found', `no job ${id} in tenant ${tenant}`)
    throw refusal(job.state)
  })

  return app
}
