import { GatewayUnreachable, type LostReason } from './errors.js'
import { pause, problemOf, type JsonAnswer } from './http.js'

/** Network failures and 5xx answers are retried this many times, backing off from 50 ms. */
export const holderRetries = 4

/** What a call under a lease needs from the lease that makes it. */
export interface HolderCall {
  /** Throws when no call may be made now (the lease ended, or the job finished under it); `lastFailure` is the retry's last failure, if any. */
  check(lastFailure: unknown): void
  send(): Promise<JsonAnswer>
  /** Marks the lease lost for `reason` and returns the error to throw. */
  lose(reason: LostReason): Error
}

/**
 * A call under the lease: refused once the lease is gone, retried on network failures and
 * 5xx answers, and a 409 `lease_lost`/`not_owner` or a 404 turned into the lease's loss.
 *
 * @example
 * const answer = await callUnderLease({ check: () => {}, send: () => api.call('POST', '/42/append', body, 5000), lose: (r) => new LeaseLost('42', r) })
 */
export async function callUnderLease(call: HolderCall): Promise<JsonAnswer> {
  let lastFailure: unknown
  for (let attempt = 0; ; attempt++) {
    call.check(lastFailure)
    let answer: JsonAnswer
    try {
      answer = await call.send()
    } catch (err) {
      if (!(err instanceof GatewayUnreachable) || attempt >= holderRetries) throw err
      lastFailure = err
      await pause(50 * 2 ** attempt)
      continue
    }
    if (answer.status === 200) return answer
    if (answer.status === 409 && (answer.body?.code === 'lease_lost' || answer.body?.code === 'not_owner')) {
      throw call.lose((answer.body.reason as LostReason | undefined) ?? 'superseded')
    }
    if (answer.status === 404) throw call.lose('not_found')
    if (answer.status >= 500 && attempt < holderRetries) {
      lastFailure = problemOf(answer)
      await pause(50 * 2 ** attempt)
      continue
    }
    throw problemOf(answer)
  }
}
