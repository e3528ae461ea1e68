import vm from 'node:vm'
import { describe, expect, it } from 'vitest'
import { compileEntityRules, entityPolicy } from '../src/rules/entities.js'
import { globMatches } from '../src/rules/glob.js'

/** What a glob meant when it was compiled to `^…$` with `.*` per star (the `s` flag: `.` takes any code unit). */
const asRegExp = (pattern: string) => new RegExp(`^${pattern.split('*').map((s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('.*')}$`, 's')

describe('entity_match globs', () => {
  it.each([
    ['invoice:*', 'invoice:42', true],
    ['invoice:*', 'invoice:', true],
    ['invoice:*', 'invoices:1', false],
    ['*:42', 'acme:invoice:42', true],
    ['*', '', true],
    ['a*b*c', 'abc', true],
    ['a*b*c', 'aXbYc', true],
    ['a*b*c', 'acb', false],
    ['ticket:vip-*', 'ticket:vip-gold-1', true],
    ['a.c', 'abc', false],
    ['a.c', 'a.c', true],
    ['(x)+?[y]$', '(x)+?[y]$', true],
    ['**', 'anything', true],
    ['*x', 'x\nx', true],
    ['x*', 'y', false],
  ])('%s against %j is %s, as the regular expression it replaced said', (pattern, entity, expected) => {
    expect(globMatches(pattern, entity)).toBe(expected)
    expect(asRegExp(pattern).test(entity)).toBe(expected)
  })

  it('agrees with the regular expression it replaced on every short pattern and entity over a small alphabet', () => {
    // Exhaustive, not random: every pattern of up to 4 characters over `a b *` against every entity of up to 5 over `a b`.
    const words = (alphabet: string, max: number): string[] => {
      const all = ['']
      for (let n = 0; all[all.length - 1]!.length < max; n++) for (const c of alphabet) all.push(all[n]! + c)
      return all.filter((w) => w.length <= max)
    }
    const entities = words('ab', 5)
    for (const pattern of words('ab*', 4)) {
      const re = asRegExp(pattern)
      for (const entity of entities) expect([pattern, entity, globMatches(pattern, entity)]).toEqual([pattern, entity, re.test(entity)])
    }
  })

  // The security review: an operator's 7-star pattern against a client's 128-character entity
  // held the event loop for 189 s. The compiled `^.*a.*a.*a.*a.*a.*a.*b$` tries every way of
  // cutting 128 characters among 7 stars before it gives up: at least C(128, 6) ≈ 5·10⁹ paths.
  // The matcher makes at most 128 × 14 comparisons. The call runs under vm's `timeout` only so
  // that the old code fails (V8 terminates the regular expression) instead of hanging the run:
  // 10 s is orders of magnitude on either side of the two, not a measurement.
  it('a 7-star rule against a 128-character entity it does not match answers at once (the regex it replaced backtracked for minutes)', () => {
    const rules = compileEntityRules([{ name: 'freeze-odd', entity_match: '*a*a*a*a*a*a*b', frozen: true }])
    const entity = 'a'.repeat(128)
    const policy = vm.runInNewContext('decide()', { decide: () => entityPolicy(rules, 'acme', entity) }, { timeout: 10_000 }) as unknown
    expect(policy).toEqual({})
    expect(entityPolicy(rules, 'acme', `${entity}b`)).toEqual({ frozenBy: 'freeze-odd' })
  })
})
