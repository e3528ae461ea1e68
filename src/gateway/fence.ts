import { FencegateError } from '../http/problems.js'

/** The header a worker presents its fencing token in. */
export const fenceHeader = 'x-execution-fence'
/** The largest fence: PostgreSQL's bigint maximum. */
export const maxFence = 9223372036854775807n

/**
 * Parses `X-Execution-Fence`: one decimal integer in 0..2^63-1, returned in
 * canonical decimal form (leading zeros dropped). `null` means the header is absent.
 * Repeated headers arrive joined by a comma and are rejected like any other junk.
 *
 * @example parseFence('42') // '42'
 * @example parseFence('0x10') // throws invalid_fence
 */
export function parseFence(value: string | null): string | undefined {
  if (value === null) return undefined
  if (!/^[0-9]{1,19}$/.test(value)) {
    throw new FencegateError('invalid_fence', 'X-Execution-Fence must be exactly one decimal integer between 0 and 9223372036854775807')
  }
  const fence = BigInt(value)
  if (fence > maxFence) throw new FencegateError('invalid_fence', 'X-Execution-Fence is larger than 9223372036854775807')
  return fence.toString()
}

/** A fence is accepted when it is greater than or equal to the highest one the entity has seen. */
export function staleFenceError(entity: string, presented: string, highest: string): FencegateError {
  return new FencegateError(
    'stale_fence',
    `fence ${presented} is lower than ${highest}, the highest accepted for ${entity}`,
    { entity, presented_fence: presented, highest_fence: highest },
  )
}
