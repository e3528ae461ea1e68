import type { ServerResponse } from 'node:http'
import { startUpstream, type ReceivedRequest, type TestUpstream } from './upstream.js'

/** What the fake did with one request: the fault a test asked for, by the `metadata[fault]` field. */
export type Fault = 'reset' | 'slow'

export interface FakeStripe {
  upstream: TestUpstream
  /** Payment intents created (executions), by idempotency key: Stripe's own de-duplication does not count. */
  executions: Map<string, number>
  /** Requests that arrived with each idempotency key, replays included. */
  arrivals(key: string): number
  /** Holds `slow` requests until the test calls it. */
  releaseSlow(): void
  /** Holds every request until `count` distinct keys have arrived (for concurrency tests); 0 turns it off. */
  holdUntilKeys(count: number): void
  close(): Promise<void>
}

/**
 * A Stripe-like upstream on loopback: `POST /v1/payment_intents` with a form
 * body, ids `pi_N`, a charge counter, and Stripe's own idempotency (the same
 * key and parameters replay the first answer; other parameters get
 * `400 idempotency_error`). `metadata[fault]=reset` executes and then drops
 * the connection once per key; `metadata[fault]=slow` holds the answer until
 * `releaseSlow()`.
 */
export async function startFakeStripe(): Promise<FakeStripe> {
  const executions = new Map<string, number>()
  const answers = new Map<string, { params: string; status: number; body: string; requestId: string }>()
  const resetDone = new Set<string>()
  let seq = 0
  let releaseSlow!: () => void
  const slow = new Promise<void>((resolve) => (releaseSlow = resolve))
  let keysWanted = 0
  let keysReady: (() => void) | undefined
  let allKeys = Promise.resolve()
  const seenKeys = new Set<string>()

  const answer = (res: ServerResponse, key: string, a: { status: number; body: string; requestId: string }, replayed: boolean) => {
    res.writeHead(a.status, {
      'content-type': 'application/json', 'request-id': a.requestId, 'stripe-version': '2025-01-27.acacia',
      'idempotency-key': key, ...(replayed ? { 'idempotent-replayed': 'true' } : {}),
    })
    res.end(a.body)
  }

  const handle = async (req: ReceivedRequest, res: ServerResponse) => {
    const key = String(req.headers['idempotency-key'] ?? '')
    seenKeys.add(key)
    if (keysWanted > 0 && seenKeys.size >= keysWanted) keysReady?.()
    await allKeys
    const params = req.body.toString()
    const form = new URLSearchParams(params)
    const known = answers.get(key)
    if (known) {
      if (known.params !== params) {
        res.writeHead(400, { 'content-type': 'application/json', 'request-id': `req_${++seq}` })
        res.end(JSON.stringify({ error: { type: 'idempotency_error', message: 'Keys for idempotent requests can only be used with the same parameters they were first used with.' } }))
        return
      }
      return answer(res, key, known, true)
    }
    const n = ++seq
    executions.set(key, (executions.get(key) ?? 0) + 1)
    const body = JSON.stringify({
      id: `pi_${n}`, object: 'payment_intent', amount: Number(form.get('amount')), currency: form.get('currency'),
      status: 'succeeded', metadata: { external_id: form.get('metadata[external_id]') },
    })
    const stored = { params, status: 200, body, requestId: `req_${n}` }
    answers.set(key, stored)
    const fault = form.get('metadata[fault]')
    if (fault === 'reset' && !resetDone.has(key)) {
      resetDone.add(key)
      res.socket?.destroy()
      return
    }
    if (fault === 'slow') await slow
    answer(res, key, stored, false)
  }

  const upstream = await startUpstream((req, res) => handle(req, res))
  return {
    upstream,
    executions,
    arrivals: (key) => upstream.received.filter((r) => r.headers['idempotency-key'] === key).length,
    releaseSlow,
    holdUntilKeys(count) {
      keysWanted = count
      allKeys = count === 0 ? Promise.resolve() : new Promise((resolve) => (keysReady = resolve))
    },
    close: () => upstream.close(),
  }
}
