// Summarises a V8 .cpuprofile (node --cpu-prof) by self time: per module (a package in
// node_modules, a Node internal, a fencegate source file) and per function.
import { readFileSync } from 'node:fs'

interface ProfileNode {
  id: number
  callFrame: { functionName: string; url: string; lineNumber: number }
}
interface CpuProfile {
  nodes: ProfileNode[]
  samples: number[]
  timeDeltas: number[]
}

export interface Summary {
  /** Sampled milliseconds, idle excluded. */
  busyMs: number
  idleMs: number
  modules: { name: string; ms: number; share: number }[]
  functions: { name: string; module: string; ms: number; share: number }[]
}

/** The module a frame belongs to, named for what a reader of the profile wants to know. */
export function moduleOf(url: string, fn: string): string {
  if (!url) {
    if (fn === '(garbage collector)') return 'GC'
    if (fn === '(idle)') return '(idle)'
    if (fn === '(program)') return '(program: V8/native, unattributed)'
    return 'native bindings (C++ called from JS)'
  }
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(url)
  if (pkg) return pkg[1]!
  const src = /\/dist\/(src\/.*)\.js$/.exec(url) ?? /\/(src\/.*)\.[jt]s$/.exec(url)
  if (src) return `fencegate ${src[1]}`
  if (url.startsWith('node:internal/deps/undici')) return 'Node\'s bundled undici (fetch, Request, Response, Headers)'
  if (url.startsWith('node:internal/webstreams')) return 'Web streams (node:internal/webstreams)'
  if (/^node:(internal\/streams|stream)/.test(url)) return 'node streams'
  if (/^node:(_http|http|internal\/http)/.test(url)) return 'node:http'
  if (/^node:(net|internal\/net|internal\/stream_base_commons|internal\/dns)/.test(url)) return 'node:net (sockets)'
  if (/^node:(crypto|internal\/crypto)/.test(url)) return 'node:crypto'
  if (/^node:(internal\/process\/task_queues|internal\/timers|timers|events|internal\/async_hooks)/.test(url)) return 'node event loop (ticks, timers, events)'
  if (url.startsWith('node:')) return `node ${url.slice(5).replace(/^internal\//, '').split('/')[0]}`
  return url
}

export function summarise(file: string, top = 25): Summary {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile
  const byId = new Map(profile.nodes.map((n) => [n.id, n]))
  const self = new Map<number, number>()
  // timeDeltas[i] is the time before sample i, so sample i's time is timeDeltas[i + 1].
  for (let i = 0; i < profile.samples.length; i++) {
    const id = profile.samples[i]!
    self.set(id, (self.get(id) ?? 0) + (profile.timeDeltas[i + 1] ?? 0) / 1000)
  }
  const modules = new Map<string, number>()
  const functions = new Map<string, { module: string; ms: number }>()
  let idleMs = 0
  let busyMs = 0
  for (const [id, ms] of self) {
    const { functionName, url, lineNumber } = byId.get(id)!.callFrame
    const module = moduleOf(url, functionName)
    if (module === '(idle)') {
      idleMs += ms
      continue
    }
    busyMs += ms
    modules.set(module, (modules.get(module) ?? 0) + ms)
    const where = url ? `${url.replace(/^.*\/(node_modules|dist)\//, '$1/')}:${lineNumber + 1}` : ''
    const name = `${functionName || '(anonymous)'}${where ? ` ${where}` : ''}`
    const f = functions.get(name) ?? { module, ms: 0 }
    f.ms += ms
    functions.set(name, f)
  }
  const share = (ms: number) => (busyMs > 0 ? ms / busyMs : 0)
  return {
    busyMs,
    idleMs,
    modules: [...modules].map(([name, ms]) => ({ name, ms, share: share(ms) })).sort((a, b) => b.ms - a.ms),
    functions: [...functions].map(([name, f]) => ({ name, module: f.module, ms: f.ms, share: share(f.ms) })).sort((a, b) => b.ms - a.ms).slice(0, top),
  }
}

export function printSummary(s: Summary, modules = 20): string[] {
  const pct = (x: number) => `${(x * 100).toFixed(1).padStart(5)}%`
  const lines = [`busy ${(s.busyMs / 1000).toFixed(1)} s sampled (idle ${(s.idleMs / 1000).toFixed(1)} s left out); self time by module:`]
  for (const m of s.modules.slice(0, modules)) lines.push(`  ${pct(m.share)}  ${m.name}`)
  lines.push('self time by function:')
  for (const f of s.functions) lines.push(`  ${pct(f.share)}  ${f.name}  [${f.module}]`)
  return lines
}

// `node dist/bench/cpuprofile.js FILE.cpuprofile [top]` summarises a profile taken elsewhere.
if (process.argv[1] && import.meta.url.endsWith(process.argv[1].split('/').pop()!) && process.argv[2]) {
  for (const l of printSummary(summarise(process.argv[2], Number(process.argv[3] ?? 25)))) console.log(l)
}
