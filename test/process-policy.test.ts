import { describe, expect, it } from 'vitest'
import { isStoreFailure, installProcessPolicy } from '../src/runtime/node/process-policy.js'
import { StoreError } from '../src/store/db.js'
import { createLogger } from '../src/observe/log.js'

const coded = (code: string) => Object.assign(new Error('driver says something'), { code })

describe('isStoreFailure', () => {
  it.each([
    ['a StoreError', new StoreError('57P01', undefined), true],
    ['57P01 from pg_terminate_backend', coded('57P01'), true],
    ['57P03, a server still starting', coded('57P03'), true],
    ['08006 connection failure', coded('08006'), true],
    ['53300 too many connections', coded('53300'), true],
    ['CONNECTION_CLOSED from postgres.js', coded('CONNECTION_CLOSED'), true],
    ['CONNECT_TIMEOUT from postgres.js', coded('CONNECT_TIMEOUT'), true],
    ['ECONNRESET', coded('ECONNRESET'), true],
    ['a unique violation (a bug if unhandled)', coded('23505'), false],
    ['a TypeError', new TypeError('x is undefined'), false],
    ['a string', 'boom', false],
    ['undefined', undefined, false],
  ])('%s: %s', (_name, err, expected) => {
    expect(isStoreFailure(err)).toBe(expected)
  })
})

describe('installProcessPolicy', () => {
  function installed() {
    const lines: string[] = []
    const exits: number[] = []
    const uninstall = installProcessPolicy(createLogger('info', (l) => lines.push(l)), (code) => exits.push(code))
    return { lines, exits, uninstall }
  }

  it('logs a store failure that escaped as an unhandled rejection, by code, and keeps the process', async () => {
    const p = installed()
    try {
      process.emit('unhandledRejection', coded('CONNECTION_CLOSED'), Promise.resolve())
    } finally {
      p.uninstall()
    }
    expect(p.exits).toEqual([])
    expect(p.lines.map((l) => JSON.parse(l) as Record<string, unknown>)).toMatchObject([{ event: 'store_failure_unhandled', store_code: 'CONNECTION_CLOSED' }])
    expect(p.lines.join('')).not.toContain('driver says something')
  })

  it('exits 1 on any other unhandled rejection', () => {
    const p = installed()
    const error = console.error
    console.error = () => {}
    try {
      process.emit('unhandledRejection', new TypeError('a bug'), Promise.resolve())
    } finally {
      console.error = error
      p.uninstall()
    }
    expect(p.exits).toEqual([1])
  })
})
