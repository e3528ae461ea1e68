import { Hono } from 'hono'
import { z } from 'zod'
import { adminScope, type Identity } from '../http/identity.js'
import { FencegateError, storeUnavailable } from '../http/problems.js'
import type { RuleRegistry } from './registry.js'
import { RuleError, type RawRule } from './schema.js'
import { ruleHistory } from './store.js'
import { StoreError, type Db } from '../store/db.js'

type Env = { Variables: { requestId: string; identity: Identity } }

const namePattern = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/
const maxRuleBytes = 64 * 1024

/** The query of `GET /rules/{name}/history`. */
export const historyQuery = z.object({ limit: z.coerce.number().int().min(1).max(1000).default(100) }).strict()

/** Rules are global: only an operator (`fencegate:admin`, or no auth on loopback) reads or changes them. */
function requireAdmin(identity: Identity): void {
  if (identity.scopes !== null && !identity.scopes.has(adminScope)) throw new FencegateError('insufficient_scope', `rules require the ${adminScope} scope`)
}

function nameOf(raw: string): string {
  if (!namePattern.test(raw)) throw new FencegateError('invalid_request', 'a rule name is 1-64 letters, digits, _ . -')
  return raw
}

/** `If-Match: "7"` (or `7`): the version the client's change was based on. */
function expectedVersion(header: string | undefined): number | undefined {
  if (header === undefined) return undefined
  const m = /^\s*(?:W\/)?"?([0-9]{1,15})"?\s*$/.exec(header)
  if (!m) throw new FencegateError('invalid_request', 'If-Match must be a rules version, e.g. "7"')
  return Number(m[1])
}

async function ruleBody(request: Request, name: string): Promise<RawRule> {
  const text = await request.text()
  if (new TextEncoder().encode(text).byteLength > maxRuleBytes) throw new FencegateError('body_too_large', `a rule is at most ${maxRuleBytes} bytes`)
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    throw new FencegateError('invalid_rule', 'the body must be one JSON object')
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new FencegateError('invalid_rule', 'the body must be one JSON object')
  const rule = value as Record<string, unknown>
  if (rule.name !== undefined && rule.name !== name) throw new FencegateError('invalid_rule', `the body names ${JSON.stringify(rule.name)}, the path ${name}`)
  return { ...rule, name }
}

/**
 * The rules API of the admin plane: `GET /rules`, `GET|PUT|DELETE /rules/{name}`
 * and `GET /rules/{name}/history`. Changes are validated with the config
 * file's schema against the whole committed rule set, versioned with who made
 * them, and applied by every instance that shares the database.
 *
 * @example
 * admin.route('/rules', createRulesApp({ registry, db }))
 */
export function createRulesApp(deps: { registry: RuleRegistry; db: Db }) {
  const { registry, db } = deps
  const app = new Hono<Env>()
  app.use(async (c, next) => {
    requireAdmin(c.get('identity'))
    await next()
  })
  const etag = (version: number) => `"${version}"`

  app.get('/', async (c) => {
    await registry.refresh()
    const set = registry.current()
    c.header('etag', etag(set.version))
    return c.json({ version: set.version, rules: set.raw })
  })

  app.get('/:name', async (c) => {
    const name = nameOf(c.req.param('name'))
    await registry.refresh()
    const set = registry.current()
    const rule = set.raw.find((r) => r.name === name)
    if (!rule) throw new FencegateError('not_found', `no rule named ${name}`)
    c.header('etag', etag(set.version))
    return c.json({ version: set.version, rule })
  })

  app.get('/:name/history', async (c) => {
    const name = nameOf(c.req.param('name'))
    const parsed = historyQuery.safeParse(c.req.query())
    if (!parsed.success) throw new FencegateError('invalid_query', parsed.error.issues[0]!.message)
    return c.json({ items: await change(() => ruleHistory(db, name, parsed.data.limit)) })
  })

  app.put('/:name', async (c) => {
    const name = nameOf(c.req.param('name'))
    const rule = await ruleBody(c.req.raw, name)
    const result = await change(() => registry.change({ name, rule, changedBy: c.get('identity').caller, source: 'api', expectedVersion: expectedVersion(c.req.header('if-match')) }))
    c.header('etag', etag(result.version))
    return c.json({ name, version: result.version, changed: result.changed, rule: result.rule })
  })

  app.delete('/:name', async (c) => {
    const name = nameOf(c.req.param('name'))
    const result = await change(() => registry.change({ name, rule: null, changedBy: c.get('identity').caller, source: 'api', expectedVersion: expectedVersion(c.req.header('if-match')) }))
    c.header('etag', etag(result.version))
    return c.json({ name, version: result.version, deleted: true })
  })
  return app
}

/** Rule errors become `invalid_rule`; a store failure fails closed as 503, naming no internals. */
async function change<T>(run: () => Promise<T>): Promise<T> {
  try {
    return await run()
  } catch (err) {
    if (err instanceof RuleError) throw new FencegateError('invalid_rule', err.problems.join('; '), { problems: err.problems })
    if (err instanceof StoreError) throw storeUnavailable('the rules could not be read or written; nothing was changed')
    throw err
  }
}
