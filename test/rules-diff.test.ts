import { describe, expect, it } from 'vitest'
import { diffRule, showValue } from '../src/rules/diff.js'

describe('diffRule', () => {
  it('lists each differing field with its old and new value, sorted, ignoring key order inside values', () => {
    expect(diffRule(
      { name: 'capture', timeout_ms: 5000, scopes: ['a'], upstream_headers: { x: '1', y: '2' }, fence: 'required' },
      { name: 'capture', timeout_ms: 2500, scopes: ['a', 'b'], upstream_headers: { y: '2', x: '1' }, ordering: 'serialize', fence: 'required' },
    )).toEqual([
      { field: 'ordering', old: undefined, new: 'serialize' },
      { field: 'scopes', old: ['a'], new: ['a', 'b'] },
      { field: 'timeout_ms', old: 5000, new: 2500 },
    ])
  })

  it('tells a field set to null from an absent one, and shows values as JSON', () => {
    expect(diffRule({ tenant: null }, {})).toEqual([{ field: 'tenant', old: null, new: undefined }])
    expect([showValue(undefined), showValue(null), showValue('x'), showValue({ b: 1, a: [2] })]).toEqual(['(unset)', 'null', '"x"', '{"a":[2],"b":1}'])
  })
})
