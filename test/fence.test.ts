import { describe, expect, it } from 'vitest'
import { fenceHeader, maxFence, parseFence, staleFenceError } from '../src/gateway/fence.js'
import { FencegateError, problemBody } from '../src/http/problems.js'

describe('parseFence', () => {
  it('treats an absent header (null) as no fence', () => {
    expect(parseFence(null)).toBeUndefined()
  })

  it.each([
    ['0', '0'],
    ['1', '1'],
    ['42', '42'],
    ['007', '7'],
    ['000', '0'],
    ['0000000000000000001', '1'],
    ['1000000000000000000', '1000000000000000000'],
    ['9007199254740993', '9007199254740993'],
    ['9223372036854775806', '9223372036854775806'],
    ['9223372036854775807', '9223372036854775807'],
  ])('accepts %j as %j', (input, expected) => {
    expect(parseFence(input)).toBe(expected)
  })

  it('returns the canonical decimal form as a string, never a number', () => {
    const fence = parseFence('9223372036854775807')
    expect(typeof fence).toBe('string')
    expect(BigInt(fence!)).toBe(maxFence)
  })

  it.each([
    ['-1'],
    ['-0'],
    ['+1'],
    ['1.5'],
    ['1.0'],
    ['0x10'],
    ['0b1'],
    ['0o7'],
    ['1e3'],
    ['1_000'],
    ['1,000'],
    ['9223372036854775808'],
    ['9999999999999999999'],
    ['18446744073709551615'],
    ['99999999999999999999'],
    ['00000000000000000001'],
    ['1, 2'],
    ['1,2'],
    ['7, 7'],
    [''],
    [' '],
    [' 1'],
    ['1 '],
    ['1\n'],
    ['\t1'],
    ['abc'],
    ['NaN'],
    ['Infinity'],
    ['١٢'],
    ['１'],
    ['null'],
  ])('rejects %j with invalid_fence', (input) => {
    let err: unknown
    try {
      parseFence(input)
    } catch (e) {
      err = e
    }
    expect(err).toBeInstanceOf(FencegateError)
    expect((err as FencegateError).code).toBe('invalid_fence')
    expect((err as FencegateError).status).toBe(400)
  })

  it('explains the accepted range', () => {
    expect(() => parseFence('x')).toThrow('9223372036854775807')
    expect(() => parseFence('9223372036854775808')).toThrow('larger than 9223372036854775807')
  })

  it('parses a repeated header as joined by Headers', () => {
    const headers = new Headers()
    headers.append(fenceHeader, '1')
    headers.append(fenceHeader, '2')
    expect(() => parseFence(headers.get(fenceHeader))).toThrow(FencegateError)
    expect(parseFence(new Headers().get(fenceHeader))).toBeUndefined()
    expect(parseFence(new Headers({ 'X-Execution-Fence': '05' }).get(fenceHeader))).toBe('5')
  })
})

describe('fence constants', () => {
  it('names the header in lower case', () => {
    expect(fenceHeader).toBe('x-execution-fence')
  })

  it('caps fences at the PostgreSQL bigint maximum', () => {
    expect(maxFence).toBe(2n ** 63n - 1n)
  })
})

describe('staleFenceError', () => {
  it('is a 409 stale_fence carrying the entity and both fences', () => {
    const err = staleFenceError('invoice:42', '3', '7')
    expect(err).toBeInstanceOf(FencegateError)
    expect(err.code).toBe('stale_fence')
    expect(err.status).toBe(409)
    expect(err.extras).toEqual({ entity: 'invoice:42', presented_fence: '3', highest_fence: '7' })
    expect(err.detail).toBe('fence 3 is lower than 7, the highest accepted for invoice:42')
    expect(problemBody(err)).toMatchObject({ code: 'stale_fence', status: 409, presented_fence: '3', highest_fence: '7' })
  })
})
