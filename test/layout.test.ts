import { readdirSync, readFileSync, statSync } from 'node:fs'
import { dirname, join, normalize, relative } from 'node:path'
import { describe, expect, it } from 'vitest'

// The layout's two promises (docs/architecture.md#layout), kept by a test so a later change
// cannot quietly break them: no import loops in src/, and a runtime-neutral core.
const src = join(import.meta.dirname, '../src')

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const path = join(dir, f)
    return statSync(path).isDirectory() ? files(path) : path.endsWith('.ts') ? [path] : []
  })
}

/** The src files a file imports statically (`import ... from`, `export ... from`), type-only imports included. */
function imports(file: string): string[] {
  const text = readFileSync(file, 'utf8')
  return [...text.matchAll(/^(?:import|export)\b[^'"]*?from '(\.[^']+)'/gm)].map((m) => normalize(join(dirname(file), m[1]!.replace(/\.js$/, '.ts'))))
}

describe('the layout of src/', () => {
  it('has no import loops', () => {
    const graph = new Map(files(src).map((f) => [f, imports(f)]))
    const state = new Map<string, 'visiting' | 'done'>()
    const loops: string[] = []
    const visit = (f: string, path: string[]) => {
      if (state.get(f) === 'done') return
      if (state.get(f) === 'visiting') {
        loops.push([...path.slice(path.indexOf(f)), f].map((p) => relative(src, p)).join(' -> '))
        return
      }
      state.set(f, 'visiting')
      for (const g of graph.get(f) ?? []) visit(g, [...path, f])
      state.set(f, 'done')
    }
    for (const f of graph.keys()) visit(f, [])
    expect(loops).toEqual([])
  })

  it('keeps the planes, rules, leases and observability runtime-neutral: no node: imports', () => {
    const core = ['gateway', 'http', 'observe', 'rules', 'leases', 'admin', 'verify', 'client'].flatMap((d) => files(join(src, d)))
    const nodeOnly = core.filter((f) => /^(?:import|export)\b[^'"]*?from ['"]node:/m.test(readFileSync(f, 'utf8')))
    expect(nodeOnly.map((f) => relative(src, f))).toEqual([])
  })
})
