import { readFileSync } from 'node:fs'
import type { ServerResponse } from 'node:http'
import { parse as parseYaml } from 'yaml'
import { startUpstream, type ReceivedRequest, type TestUpstream } from './upstream.js'

/** A fault a test asks the fake for, in a field of the request it names per API. */
export type Fault = 'reset' | 'slow' | 'stall'

/** One answer of the fake: status, JSON body and headers. */
export interface FakeAnswer {
  status: number
  body: unknown
  headers?: Record<string, string>
}

/** How one vendor's API behaves, for the calls a test makes. */
export interface FakeApiSpec {
  /** The key the API itself de-duplicates by (Square's body field, an Idempotency-Key header), if any. */
  keyOf(req: ReceivedRequest): string | undefined
  /** What names the operation for counting executions (by default the key). */
  nameOf?(req: ReceivedRequest): string
  faultOf(req: ReceivedRequest): Fault | undefined
  /** The answer to a new operation; `n` counts executions across all names. */
  execute(req: ReceivedRequest, n: number): FakeAnswer
  /** The API's answer to its key used again with other parameters. */
  reused(req: ReceivedRequest): FakeAnswer
}

export interface FakeApi {
  upstream: TestUpstream
  /** Operations executed, by name: the API's own de-duplication does not count. */
  executions: Map<string, number>
  /** Requests that arrived with each name, replays included. */
  arrivals(name: string): number
  /** Lets `slow` requests answer. */
  releaseSlow(): void
  /** Holds every request until `count` distinct names have arrived (for concurrency tests); 0 turns it off. */
  holdUntilNames(count: number): void
  close(): Promise<void>
}

/**
 * A vendor-like upstream on loopback (a real node:http server): it executes each new
 * operation once, and, where the API de-duplicates keys itself, answers the same key and
 * parameters with the stored answer and other parameters with the API's reuse error. A
 * `reset` executes and then drops the connection, once per name; `slow` holds the answer
 * until `releaseSlow()`; `stall` executes and never answers that request (a retry with the
 * key gets the stored answer). The model is test/helpers/fake-stripe.ts, for any API.
 */
export async function startFakeApi(spec: FakeApiSpec): Promise<FakeApi> {
  const nameOf = (req: ReceivedRequest) => spec.nameOf?.(req) ?? spec.keyOf(req) ?? ''
  const executions = new Map<string, number>()
  const answers = new Map<string, { params: string; answer: FakeAnswer }>()
  const resetDone = new Set<string>()
  let n = 0
  let releaseSlow!: () => void
  const slow = new Promise<void>((resolve) => (releaseSlow = resolve))
  let namesWanted = 0
  let namesReady: (() => void) | undefined
  let allNames = Promise.resolve()
  const seen = new Set<string>()

  const send = (res: ServerResponse, a: FakeAnswer) => {
    res.writeHead(a.status, { 'content-type': 'application/json', ...a.headers })
    res.end(JSON.stringify(a.body))
  }

  const handle = async (req: ReceivedRequest, res: ServerResponse) => {
    const name = nameOf(req)
    seen.add(name)
    if (namesWanted > 0 && seen.size >= namesWanted) namesReady?.()
    await allNames
    const key = spec.keyOf(req)
    const params = req.body.toString()
    const known = key === undefined ? undefined : answers.get(key)
    if (known) return send(res, known.params === params ? known.answer : spec.reused(req))
    executions.set(name, (executions.get(name) ?? 0) + 1)
    const answer = spec.execute(req, ++n)
    if (key !== undefined) answers.set(key, { params, answer })
    const fault = spec.faultOf(req)
    if (fault === 'reset' && !resetDone.has(name)) {
      resetDone.add(name)
      res.socket?.destroy()
      return
    }
    if (fault === 'stall') return
    if (fault === 'slow') await slow
    send(res, answer)
  }

  const upstream = await startUpstream((req, res) => handle(req, res))
  return {
    upstream,
    executions,
    arrivals: (name) => upstream.received.filter((r) => nameOf(r) === name).length,
    releaseSlow,
    holdUntilNames(count) {
      namesWanted = count
      seen.clear()
      allNames = count === 0 ? Promise.resolve() : new Promise((resolve) => (namesReady = resolve))
    },
    close: () => upstream.close(),
  }
}

/** The JSON body of a request the fake received (an empty object when it is not JSON). */
export function jsonOf(req: ReceivedRequest): Record<string, any> {
  try {
    return JSON.parse(req.body.toString()) as Record<string, any>
  } catch {
    return {}
  }
}

/** The routes of a recipe page's first YAML block (docs/recipes/NAME.md), pointed at `upstream` instead of the vendor. */
export function recipeRoutes(name: string, upstream: string): Record<string, unknown>[] {
  const doc = readFileSync(new URL(`../../docs/recipes/${name}.md`, import.meta.url), 'utf8')
  const yaml = /```yaml\n([\s\S]*?)```/.exec(doc)![1]!
  return (parseYaml(yaml) as { routes: Record<string, unknown>[] }).routes.map((r) => ({ ...r, upstream }))
}
