import { describe, expect, it } from 'vitest'
import { webHeaders, type HeaderFields } from '../src/http/exchange.js'
import { HeaderList } from '../src/http/header-list.js'

type Step = [op: 'append' | 'set', name: string, value: string] | [op: 'delete', name: string]

/** What a reader of the fields sees: every name once with its joined value (name order), and the cookies apart. */
function seen(fields: HeaderFields, names: string[]) {
  const listed: [string, string][] = []
  fields.forEach((value, name) => {
    if (name !== 'set-cookie') listed.push([name, value])
  })
  return {
    listed: listed.sort(([a], [b]) => (a < b ? -1 : 1)),
    got: names.map((name) => [fields.get(name), fields.has(name)]),
    cookies: fields.getSetCookie(),
  }
}

function play(fields: HeaderFields, steps: Step[]): HeaderFields {
  for (const step of steps) {
    if (step[0] === 'delete') fields.delete(step[1])
    else fields[step[0]](step[1], step[2])
  }
  return fields
}

const scripts: [string, Step[]][] = [
  ['one field', [['append', 'Content-Type', 'application/json']]],
  ['a repeated field, joined with ", "', [['append', 'accept', 'text/html'], ['append', 'Accept', 'application/json']]],
  ['set replaces every earlier value', [['append', 'x-a', '1'], ['append', 'x-b', '2'], ['append', 'X-A', '3'], ['set', 'x-a', '4']]],
  ['delete removes every value, whatever its case', [['append', 'x-a', '1'], ['append', 'x-a', '2'], ['delete', 'X-A'], ['append', 'x-b', '3']]],
  ['cookies stay apart', [['append', 'set-cookie', 'a=1; Path=/'], ['append', 'Set-Cookie', 'b=2, c'], ['append', 'x-c', '1']]],
  ['set on a field that is absent adds it', [['set', 'X-Request-Id', 'r-1']]],
  ['delete of an absent field changes nothing', [['append', 'etag', '"x"'], ['delete', 'x-none']]],
]
const names = ['content-type', 'accept', 'x-a', 'x-b', 'x-c', 'set-cookie', 'x-request-id', 'etag', 'x-none']

describe('HeaderList reads as Web Headers do', () => {
  it.each(scripts)('%s', (_what, steps) => {
    expect(seen(play(new HeaderList(), steps), names)).toEqual(seen(play(new Headers(), steps), names))
  })

  it('yields a repeated name once, joined, where it was first seen', () => {
    const list = new HeaderList([['x-a', '1'], ['x-b', '2'], ['x-a', '3']])
    const yielded: [string, string][] = []
    list.forEach((value, name) => yielded.push([name, value]))
    expect(yielded).toEqual([['x-a', '1, 3'], ['x-b', '2']])
  })

  it('becomes Web Headers with every cookie kept apart', () => {
    const list = play(new HeaderList(), scripts[4]![1])
    const web = webHeaders(list)
    expect(web).toBeInstanceOf(Headers)
    expect(web.getSetCookie()).toEqual(['a=1; Path=/', 'b=2, c'])
    expect(web.get('x-c')).toBe('1')
  })

  it('copies Web Headers, so that editing the copy leaves the original as it was', () => {
    const web = new Headers({ a: '1' })
    const copy = webHeaders(web)
    expect(copy).not.toBe(web)
    expect([...copy.entries()]).toEqual([['a', '1']])
    copy.set('a', '2')
    expect(web.get('a')).toBe('1')
  })
})
