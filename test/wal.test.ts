import { describe, expect, it } from 'vitest'
import { compareLsn, latestPosition, readPosition } from '../src/store/wal.js'

describe('WAL positions (src/store/wal.ts)', () => {
  it.each([
    ['0/16B3748', '0/16B3750', -1],
    ['0/16B3750', '0/16B3748', 1],
    ['0/16B3748', '0/16B3748', 0],
    // The high half decides first, whatever the low halves' lengths.
    ['1/0', '0/FFFFFFFF', 1],
    ['A/1', '9/FFFFFFFF', 1],
    ['FFFFFFFF/FFFFFFFF', 'FFFFFFFF/FFFFFFFE', 1],
    ['0/ABCDEF', '0/abcdef', 0],
  ])('compareLsn(%s, %s) is %i', (a, b, sign) => {
    expect(compareLsn(a, b)).toBe(sign)
  })

  it('reads a statement\'s position and picks the furthest of several', () => {
    const at = (lsn: string | null) => readPosition({ fg_wal: '000000020000000000000001', fg_lsn: lsn, fg_boot: '1764979200.5' })
    expect(at('0/1A')).toEqual({ timeline: 2, lsn: '0/1A', boot: '1764979200.5' })
    expect(readPosition({ fg_wal: null, fg_lsn: null, fg_boot: null })).toBeUndefined()
    expect(latestPosition([at('0/1A'), at(null), at('1/0'), undefined, at('0/FF')])?.lsn).toBe('1/0')
  })
})
