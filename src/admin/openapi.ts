import { z } from 'zod'
import { auditQuerySchema, auditSummarySchema, bumpRequestSchema, entityPageSchema, tenantQuerySchema } from './query.js'
import { jobListQuerySchema } from './jobs.js'
import { livenessSchema, readinessSchema } from './probes.js'
import { problemCatalog, type ProblemCode } from '../http/problems.js'
import { entityRuleSchema, routeSchema } from '../config/schema.js'
import { historyQuery } from '../rules/api.js'

/*
 * The admin plane's OpenAPI 3.1 description. Query parameters come from the
 * zod schemas admin.ts validates with; the answers are described by the zod
 * schemas below, which test/openapi.test.ts checks real answers against, so
 * neither side can drift without a test failing.
 */

// Defined next to the parser that validates with it.
export { bumpRequestSchema }

const codes = Object.keys(problemCatalog) as [ProblemCode, ...ProblemCode[]]
const timestamp = z.string().describe('ISO-8601, UTC, microseconds, rendered by the database')
const fence = z.string().regex(/^[0-9]{1,19}$/).describe('A fence: a decimal integer, as a string (it may exceed 2^53)')

/** RFC 9457 problem+json, the body of every error on both planes; `code` is stable, the rest is for people. */
export const problemSchema = z.object({
  type: z.string().describe('urn:fencegate:problem:<code>'),
  title: z.string(),
  status: z.number().int(),
  detail: z.string(),
  code: z.enum(codes),
  request_id: z.string().optional().describe('The X-Request-Id of the request, also sent as that header'),
}).catchall(z.unknown()).describe('Extension members (entity, presented_fence, highest_fence, parameter, reason, ...) depend on the code')

export const healthSchema = z.object({
  status: z.enum(['ok', 'unavailable']),
  store: z.enum(['up', 'down']),
  // What the store can lose, and why every command is refused while it is (docs/operations.md#failover).
  durability: z.enum(['replicated', 'local', 'unknown']),
  refusing: z.enum(['store_not_replicated', 'store_identity_changed', 'store_lost_commits']).optional(),
  // With server.workers > 1: the workers serving now.
  workers: z.number().int().min(0).optional(),
}).strict()

export const auditPageSchema = z.object({
  items: z.array(z.object({
    id: z.string(), at: timestamp, tenant: z.string(), route: z.string().nullable(), entity: z.string().nullable(),
    code: z.string(), presented_fence: fence.nullable(), highest_fence: fence.nullable(), method: z.string(), path: z.string(),
    body_sha256: z.string().nullable().describe('SHA-256 of the request body; the body itself is never stored'),
    caller: z.string().nullable(), request_id: z.string(), idempotency_key: z.string().nullable(),
    trace_id: z.string().regex(/^[0-9a-f]{32}$/).nullable()
      .describe('The W3C trace id of the request that caused the row (its SERVER span\'s, sampled or not); null when tracing was off'),
    trace_from_caller: z.boolean().nullable()
      .describe('true when trace_id came from the caller\'s traceparent (the caller chose it), false when the gateway started the trace; null without a trace_id and on rows written before migration 0020'),
  }).strict()),
  next_cursor: z.string().nullable().describe('Pass as ?cursor= for the next page; null on the last page'),
}).strict()

export const entityStateSchema = z.object({
  tenant: z.string(), entity: z.string(), highest_fence: fence, updated_at: timestamp,
  request_id: z.string().describe('The request that last presented the highest fence'),
}).strict()

export const keyStateSchema = z.object({
  tenant: z.string(), key: z.string(), state: z.enum(['in_flight', 'completed', 'outcome_unknown', 'not_replayable']),
  fingerprint: z.string(), route: z.string(), entity: z.string().nullable(), fence: fence.nullable(), status: z.number().int().nullable(),
  attempt: z.number().int(), request_id: z.string(), created_at: timestamp, completed_at: timestamp.nullable(),
  locked_until: timestamp.nullable(), expires_at: timestamp,
}).strict()

/** The answer of `POST /entities/{entity}/bump`. */
export const bumpResultSchema = z.object({
  tenant: z.string(), entity: z.string(), previous_fence: fence.nullable().describe('null when no fence had been accepted for the entity'),
  highest_fence: fence, raised: z.boolean().describe('false when the highest fence was already at or above min_fence'),
}).strict()

export const keyReleasedSchema = z.object({ key: z.string(), tenant: z.string(), released: z.literal(true), previous_state: z.string() }).strict()

export const fenceHistoryPageSchema = z.object({
  items: z.array(z.object({
    id: z.string(), at: timestamp, tenant: z.string(), entity: z.string(),
    old_fence: fence.nullable().describe('null when this was the first fence accepted for the entity'), new_fence: fence,
    source: z.enum(['command', 'bump']).describe('command: a request presented it; bump: an operator raised it'),
    route: z.string().nullable(), caller: z.string().nullable(), request_id: z.string().nullable(),
  }).strict()),
  next_cursor: z.string().nullable().describe('Pass as ?before= for the next page; null on the last page'),
}).strict()

export const entityKeysSchema = z.object({
  items: z.array(z.object({
    key: z.string(), state: z.enum(['in_flight', 'completed', 'outcome_unknown', 'not_replayable']), route: z.string(), fence: fence.nullable(),
    status: z.number().int().nullable(), attempt: z.number().int(), request_id: z.string(),
    created_at: timestamp, completed_at: timestamp.nullable(), expires_at: timestamp,
  }).strict()),
}).strict()

export const auditSummaryResultSchema = z.object({
  bucket_ms: z.number().int(),
  buckets: z.array(z.object({ at: z.string().describe('The bucket\'s start (ISO-8601, UTC), aligned to the epoch on the database clock'), code: z.string(), count: z.number().int() }).strict())
    .describe('Oldest first; a bucket without rejections of a code is absent'),
}).strict()

const jobFields = {
  job_id: z.string(), type: z.string(), key: z.string(), state: z.enum(['queued', 'running', 'succeeded', 'failed', 'cancelled']),
  attempt: z.number().int(), fence: fence, owner: z.string().nullable(),
  remaining_lease_ms: z.number().int().nullable().describe('Left on a running job\'s lease, on the database clock; null unless running'),
  cancel_requested: z.boolean(), error_code: z.string().nullable(), cursor_length: z.number().int(),
  created_at: timestamp, started_at: timestamp.nullable(), finished_at: timestamp.nullable(), run_after: timestamp,
}
export const jobListSchema = z.object({ items: z.array(z.object(jobFields).strict()), next_cursor: z.string().nullable() }).strict()
export const jobDetailSchema = z.object({ ...jobFields, result: z.unknown(), error: z.unknown() }).strict()
/** What an operator action on a job answers. */
export const jobActionSchema = z.object({ tenant: z.string(), job_id: z.string(), state: z.string(), fence: z.string() }).strict()

/** The answers of the rules API (src/rules/api.ts); a rule is an object as the config file writes it. */
const ruleObject = z.object({ name: z.string() }).catchall(z.unknown())
export const ruleSetSchema = z.object({ version: z.number().int(), rules: z.array(ruleObject) }).strict()
export const ruleOneSchema = z.object({ version: z.number().int(), rule: ruleObject }).strict()
export const ruleChangedSchema = z.object({ name: z.string(), version: z.number().int(), changed: z.boolean(), rule: ruleObject }).strict()
export const ruleDeletedSchema = z.object({ name: z.string(), version: z.number().int(), deleted: z.literal(true) }).strict()
export const ruleHistorySchema = z.object({
  items: z.array(z.object({
    version: z.number().int(), name: z.string(), kind: z.enum(['route', 'entity']), rule: ruleObject.nullable(),
    changed_by: z.string().nullable(), changed_at: z.string(), source: z.enum(['api', 'config']),
  }).strict()),
}).strict()

function jsonSchema(schema: z.ZodType, io: 'input' | 'output' = 'output'): Record<string, unknown> {
  // Input schemas describe what a client sends; their transforms (durations, sizes) have no JSON form.
  const { $schema: _dialect, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: 'any' }) as Record<string, unknown>
  return rest
}

function queryParameters(schema: z.ZodObject): Record<string, unknown>[] {
  return Object.entries(schema.shape).map(([name, field]) => {
    const { description, ...rest } = jsonSchema(field as z.ZodType)
    return { name, in: 'query', required: !(field as z.ZodType).safeParse(undefined).success, description, schema: rest }
  })
}

const pathParameter = (name: string, description: string) => ({ name, in: 'path', required: true, description, schema: { type: 'string' } })
const json = (schema: string, description: string) => ({ description, content: { 'application/json': { schema: { $ref: `#/components/schemas/${schema}` } } } })
const problem = { $ref: '#/components/responses/Problem' }
const ifMatch = { name: 'If-Match', in: 'header', required: false, description: 'The rules version the change is based on, e.g. "7"', schema: { type: 'string' } }
const errors = (...statuses: number[]) => Object.fromEntries(statuses.map((s) => [String(s), problem]))

function buildDocument() {
  return {
    openapi: '3.1.0',
    info: {
      title: 'fencegate admin plane',
      version: '1',
      description: 'The admin API. With auth.mode: jwt every endpoint but /health, /livez and /readyz needs a bearer token; /openapi.json accepts any valid token, '
        + '/audit and /audit/summary fencegate:admin or fencegate:audit (own tenant only), everything else fencegate:admin. Errors on both planes, data plane '
        + 'included, are application/problem+json (components.schemas.Problem) with a stable code; x-problem-codes lists every code with its status.',
    },
    security: [{ bearer: [] }],
    paths: { ...readPaths(), ...incidentPaths(), ...rulePaths() },
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' } },
      responses: { Problem: { description: 'A problem (RFC 9457)', content: { 'application/problem+json': { schema: { $ref: '#/components/schemas/Problem' } } } } },
      schemas: {
        Problem: jsonSchema(problemSchema),
        Health: jsonSchema(healthSchema),
        Liveness: jsonSchema(livenessSchema),
        Readiness: jsonSchema(readinessSchema),
        AuditPage: jsonSchema(auditPageSchema),
        EntityState: jsonSchema(entityStateSchema),
        KeyState: jsonSchema(keyStateSchema),
        KeyReleased: jsonSchema(keyReleasedSchema),
        BumpRequest: jsonSchema(bumpRequestSchema),
        BumpResult: jsonSchema(bumpResultSchema),
        FenceHistoryPage: jsonSchema(fenceHistoryPageSchema),
        EntityKeys: jsonSchema(entityKeysSchema),
        AuditSummary: jsonSchema(auditSummaryResultSchema),
        JobList: jsonSchema(jobListSchema),
        JobDetail: jsonSchema(jobDetailSchema),
        JobAction: jsonSchema(jobActionSchema),
        RouteRule: jsonSchema(routeSchema, 'input'),
        EntityRule: jsonSchema(entityRuleSchema, 'input'),
        RuleSet: jsonSchema(ruleSetSchema),
        RuleOne: jsonSchema(ruleOneSchema),
        RuleChanged: jsonSchema(ruleChangedSchema),
        RuleDeleted: jsonSchema(ruleDeletedSchema),
        RuleHistory: jsonSchema(ruleHistorySchema),
      },
    },
    'x-problem-codes': Object.fromEntries(Object.entries(problemCatalog).map(([code, p]) => [code, { status: p.status, title: p.title }])),
  }
}

/** Health and the read views: the audit trail and its summary, an entity's history and keys, jobs. */
function readPaths() {
  const tenantQuery = queryParameters(tenantQuerySchema)
  return {
    '/livez': { get: { summary: 'Whether the process serves (never fails because the store is down)', security: [], responses: { 200: json('Liveness', 'The process serves HTTP') } } },
    '/readyz': { get: { summary: 'Whether to send this gateway traffic', security: [], responses: { 200: json('Readiness', 'Ready'), 503: json('Readiness', 'Not ready: draining, store, migrations, rules or refusing') } } },
    '/health': { get: { summary: 'Whether the store answers', security: [], responses: { 200: json('Health', 'The store is up and commands are served'), 503: json('Health', 'The store is down, or every command is refused for what it can lose') } } },
    '/audit': {
      get: {
        summary: 'The audit trail of rejected commands, newest first: one JSON page, or every matching row streamed as NDJSON or CSV',
        parameters: queryParameters(auditQuerySchema),
        responses: { 200: { ...json('AuditPage', 'One page'), content: { ...json('AuditPage', '').content, 'application/x-ndjson': { schema: { type: 'string' } }, 'text/csv': { schema: { type: 'string' } } } }, ...errors(400, 401, 403, 503) },
      },
    },
    '/audit/summary': { get: { summary: 'Rejections counted by code per time bucket (default: the last hour by the minute)', parameters: queryParameters(auditSummarySchema), responses: { 200: json('AuditSummary', 'The buckets'), ...errors(400, 401, 403, 503) } } },
    '/entities/{entity}/history': { get: { summary: "Every change of the entity's highest fence, newest first", parameters: [pathParameter('entity', 'The entity, e.g. invoice:42'), ...queryParameters(entityPageSchema)], responses: { 200: json('FenceHistoryPage', 'One page'), ...errors(400, 401, 403, 503) } } },
    '/entities/{entity}/keys': { get: { summary: "The entity's live idempotency records, newest first (no bodies)", parameters: [pathParameter('entity', 'The entity, e.g. invoice:42'), ...queryParameters(entityPageSchema.omit({ before: true }))], responses: { 200: json('EntityKeys', 'The records'), ...errors(400, 401, 403, 503) } } },
    '/jobs': { get: { summary: 'Jobs newest first, with each running job\'s holder, fence, attempt and remaining lease', parameters: queryParameters(jobListQuerySchema), responses: { 200: json('JobList', 'One page'), ...errors(400, 401, 403, 503) } } },
    '/jobs/{id}': { get: { summary: 'One job, with its result and error (never its payload)', parameters: [pathParameter('id', 'The job id'), ...tenantQuery], responses: { 200: json('JobDetail', 'The job'), ...errors(400, 401, 403, 404, 503) } } },
    ...jobActionPaths(tenantQuery),
  }
}

/** An operator's actions on a job, each audited with the operator as caller. */
function jobActionPaths(tenantQuery: ReturnType<typeof queryParameters>) {
  const action = (summary: string) => ({
    post: { summary, parameters: [pathParameter('id', 'The job id'), ...tenantQuery], responses: { 200: json('JobAction', 'The job after the action'), ...errors(400, 401, 403, 404, 409, 503) } },
  })
  return {
    '/jobs/{id}/cancel': action('Cancels a job: a queued one at once, a running one at its holder\'s next heartbeat (audited as job_cancelled)'),
    '/jobs/{id}/release': action('Ends a running job\'s lease now: queued again, the next claim gets a higher fence, the old holder is refused (audited as job_released)'),
    '/jobs/{id}/retry': action('Runs a failed or cancelled job again, as a new attempt cycle (audited as job_retried)'),
  }
}

/** Incident response: an entity's fence and its bump, an idempotency record and its release. */
function incidentPaths() {
  const tenantQuery = queryParameters(tenantQuerySchema)
  return {
    '/entities/{entity}': { get: { summary: "An entity's highest accepted fence", parameters: [pathParameter('entity', 'The entity, e.g. invoice:42'), ...tenantQuery], responses: { 200: json('EntityState', 'The entity'), ...errors(400, 401, 403, 404, 503) } } },
    '/entities/{entity}/bump': {
      post: {
        summary: 'Raises the entity\'s highest fence to at least min_fence, cutting off every holder of a lower one (audited)',
        parameters: [pathParameter('entity', 'The entity, e.g. invoice:42'), ...tenantQuery],
        requestBody: { required: true, content: { 'application/json': { schema: { $ref: '#/components/schemas/BumpRequest' } } } },
        responses: { 200: json('BumpResult', 'The fence after the bump'), ...errors(400, 401, 403, 503) },
      },
    },
    '/idempotency/{key}': {
      get: { summary: 'A live idempotency record', parameters: [pathParameter('key', 'The Idempotency-Key'), ...tenantQuery], responses: { 200: json('KeyState', 'The record'), ...errors(400, 401, 403, 404, 503) } },
      delete: { summary: 'Releases an unknown outcome after reconciling it', parameters: [pathParameter('key', 'The Idempotency-Key'), ...tenantQuery], responses: { 200: json('KeyReleased', 'Released'), ...errors(400, 401, 403, 404, 409, 503) } },
    },
  }
}

/** Rules at runtime, metrics and this document. */
function rulePaths() {
  return {
    '/rules': { get: { summary: 'The rules in use (routes and entity rules) and their version; ETag is the version', responses: { 200: json('RuleSet', 'The rules'), ...errors(401, 403, 503) } } },
    '/rules/{name}': {
      get: { summary: 'One rule', parameters: [pathParameter('name', 'The rule name')], responses: { 200: json('RuleOne', 'The rule'), ...errors(400, 401, 403, 404) } },
      put: {
        summary: 'Creates or replaces a rule (validated against the whole set, versioned, applied by every instance); If-Match: "<version>" refuses a change based on an older version',
        parameters: [pathParameter('name', 'The rule name'), ifMatch],
        requestBody: { required: true, content: { 'application/json': { schema: { oneOf: [{ $ref: '#/components/schemas/RouteRule' }, { $ref: '#/components/schemas/EntityRule' }] } } } },
        responses: { 200: json('RuleChanged', 'The rule as stored'), ...errors(400, 401, 403, 412, 413, 422, 503) },
      },
      delete: { summary: 'Deletes a rule (versioned)', parameters: [pathParameter('name', 'The rule name'), ifMatch], responses: { 200: json('RuleDeleted', 'Deleted'), ...errors(400, 401, 403, 404, 412, 503) } },
    },
    '/rules/{name}/history': { get: { summary: "A rule's versions, newest first, with who changed it and when", parameters: [pathParameter('name', 'The rule name'), ...queryParameters(historyQuery)], responses: { 200: json('RuleHistory', 'The versions'), ...errors(400, 401, 403, 503) } } },
    '/metrics': { get: { summary: 'Prometheus metrics (text exposition format); see docs/operations.md', responses: { 200: { description: 'The metrics', content: { 'text/plain': { schema: { type: 'string' } } } }, ...errors(401, 403, 404) } } },
    '/openapi.json': { get: { summary: 'This document', responses: { 200: { description: 'OpenAPI 3.1', content: { 'application/json': { schema: { type: 'object' } } } }, ...errors(401) } } },
  }
}

let built: ReturnType<typeof buildDocument> | undefined

/**
 * The admin plane's OpenAPI document, built once from the schemas.
 *
 * @example
 * const doc = adminOpenApi()
 * console.log(Object.keys(doc.paths))
 */
export function adminOpenApi(): ReturnType<typeof buildDocument> {
  built ??= buildDocument()
  return built
}
