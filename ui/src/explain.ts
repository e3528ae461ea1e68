// Plain language for each code the audit trail records: what it means and what to do.

export interface Explanation { title: string; meaning: string; todo: string }

const table: Record<string, Explanation> = {
  stale_fence: {
    title: 'Stale fence',
    meaning: 'A worker presented a fence lower than the highest one already accepted for this entity. It lost its lease and another worker took over; it does not know yet. Its command was refused and never reached the upstream.',
    todo: 'Nothing was harmed. If the same worker keeps trying, stop or restart it. If you no longer trust any current holder, bump the entity\'s fence.',
  },
  fence_required: {
    title: 'Fence missing',
    meaning: 'The route requires an X-Execution-Fence header and the request had none. It was not forwarded.',
    todo: 'Fix the caller: it must send the fencing token of its lease with every command.',
  },
  invalid_fence: {
    title: 'Malformed fence',
    meaning: 'The X-Execution-Fence header was not one decimal integer (0 to 9223372036854775807). It was not forwarded.',
    todo: 'Fix the caller\'s header: digits only, sent once.',
  },
  lease_expired: {
    title: 'Lease expired',
    meaning: 'On a lease-bound route the job\'s lease had expired, been taken over or cancelled when the worker called. Nothing was forwarded.',
    todo: 'The worker should stop this job; the job is retried by its next holder.',
  },
  fence_bumped: {
    title: 'Fence bumped by an operator',
    meaning: 'An operator raised the entity\'s lowest acceptable fence: every holder of a lower one is refused from then on.',
    todo: 'Nothing, unless the bump was not expected: the caller column says who made it.',
  },
  job_cancelled: {
    title: 'Job cancelled by an operator',
    meaning: 'An operator cancelled the job (the entity is job:<id>): a queued job ended at once, a running one was told at its holder\'s next heartbeat.',
    todo: 'Nothing, unless the cancel was not expected: the caller column says who made it.',
  },
  job_released: {
    title: 'Lease ended by an operator',
    meaning: 'An operator ended a running job\'s lease: the job went back to the queue, its next holder got a higher fence, and the old holder is refused from then on.',
    todo: 'If the old holder keeps writing, its rejections (lease_lost, stale_fence) show here; stop or restart that worker.',
  },
  job_retried: {
    title: 'Job retried by an operator',
    meaning: 'An operator ran a failed or cancelled job again, as a new attempt cycle under a higher fence.',
    todo: 'Nothing, unless the retry was not expected: the caller column says who made it.',
  },
  entity_frozen: {
    title: 'Entity frozen',
    meaning: 'An entity rule freezes this entity: every command to it is refused before its fence or key is looked at.',
    todo: 'Unfreeze it (Entity screen, or delete the rule) when the incident is over.',
  },
  tenant_mismatch: {
    title: 'Tenant mismatch',
    meaning: 'The request named a tenant other than its token\'s. It was not forwarded.',
    todo: 'Check the caller\'s configuration or token: this can be an attempt to act for another tenant.',
  },
  insufficient_scope: {
    title: 'Missing scope',
    meaning: 'The caller\'s token lacks a scope the route requires.',
    todo: 'Grant the scope if the caller should be allowed; otherwise find out why it tried.',
  },
  idempotency_key_reused: {
    title: 'Key reused with another payload',
    meaning: 'An Idempotency-Key already used for one request came with a different body.',
    todo: 'Fix the caller: a new operation needs a new key.',
  },
  idempotency_key_released: {
    title: 'Key released by an operator',
    meaning: 'An operator released an idempotency key whose outcome was unknown, so the next request with it is forwarded again.',
    todo: 'Nothing, unless the release was not expected.',
  },
}

/** What a code means; unknown codes get a neutral explanation rather than none. */
export function explain(code: string): Explanation {
  return table[code] ?? { title: code.replace(/_/g, ' '), meaning: `The gateway refused the command with ${code}.`, todo: 'See docs/http-contract.md for this code.' }
}

export const knownCodes = Object.keys(table)
