// Summarises a V8 .cpuprofile (node --cpu-prof) by self time: per module (a package in
// node_modules, a Node internal, a fencegate source file) and per function.
import { readFileSync } from 'node:fs'

interface ProfileNode {
  id: number
  callFrame: { functionName: string; url: string; lineNumber: number }
  children?: number[]
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
  /** The modules rolled up into what the data plane is made of. */
  families: { name: string; ms: number; share: number }[]
  /** The same, with Node's own JS and natives charged to the library that called into them. */
  charged: { name: string; ms: number; share: number }[]
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
  if (url.startsWith('node:internal/webstreams') || url.startsWith('node:internal/worker/js_transferable')) return 'Web streams (node:internal/webstreams, makeTransferable)'
  if (url.startsWith('node:internal/abort_controller')) return 'AbortSignal (node:internal/abort_controller)'
  // undici's llhttp and PGlite's PostgreSQL are both WebAssembly: summarise() names the module by its JS caller.
  if (url.startsWith('wasm://')) return 'WebAssembly'
  if (/^node:(internal\/streams|stream)/.test(url)) return 'node streams'
  if (/^node:(_http|http|internal\/http)/.test(url)) return 'node:http'
  if (/^node:(net|internal\/net|internal\/stream_base_commons|internal\/dns)/.test(url)) return 'node:net (sockets)'
  if (/^node:(crypto|internal\/crypto)/.test(url)) return 'node:crypto'
  if (/^node:(internal\/process\/task_queues|internal\/timers|timers|events|internal\/async_hooks)/.test(url)) return 'node event loop (ticks, timers, events)'
  if (url.startsWith('node:')) return `node ${url.slice(5).replace(/^internal\//, '').split('/')[0]}`
  return url
}

/**
 * Node's own machinery (http, net, streams, events), as opposed to the Web APIs Node
 * implements in JS (Web streams, fetch's Request/Response/Headers, AbortSignal), which
 * are a cost of their own in this profile.
 */
function isNodeCore(url: string): boolean {
  return url.startsWith('node:') && !/^node:internal\/(webstreams|deps\/undici|abort_controller|worker\/js_transferable)/.test(url)
}

/** The part of the data plane a module belongs to, for the roll-up. */
export function familyOf(module: string): string {
  if (module === '@hono/node-server' || module.startsWith('Node\'s bundled undici') || module.startsWith('AbortSignal')) return 'Web Request/Response wrapping (@hono/node-server, Request/Response/Headers, AbortSignal)'
  if (module.startsWith('Web streams')) return 'Web streams'
  if (module === 'undici' || module === 'WebAssembly, from undici') return 'undici (forwarding client, llhttp)'
  if (module === 'hono') return 'hono (router, context)'
  if (module === 'postgres' || module.startsWith('fencegate src/store') || /^(WebAssembly, from )?@electric-sql\/pglite$/.test(module)) return 'the store (postgres.js or PGlite, src/store)'
  if (module === 'pino' || module === 'prom-client' || module === 'zod') return module
  if (module === 'node:crypto' || module === 'fencegate src/runtime/node/hash') return 'hashing (node:crypto, src/runtime/node/hash)'
  if (module.startsWith('fencegate ')) return 'fencegate src (other)'
  if (module === 'GC') return 'GC'
  if (/^node(:| )/.test(module)) return 'Node core (http, net, streams, events, ticks)'
  if (module.startsWith('native')) return module
  return 'other'
}

export function summarise(file: string, top = 25): Summary {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile
  const byId = new Map(profile.nodes.map((n) => [n.id, n]))
  const parent = new Map<number, number>()
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
  /**
   * A native function's nearest caller outside Node's own JavaScript (postgres.js, undici,
   * @hono/node-server, fencegate...), whose module it is charged to; else its nearest JS caller.
   */
  const callerOf = (id: number, includeSelf = false): ProfileNode | undefined => {
    let nearest: ProfileNode | undefined
    for (let p: number | undefined = includeSelf ? id : parent.get(id); p !== undefined; p = parent.get(p)) {
      const n = byId.get(p)!
      if (!n.callFrame.url) continue
      nearest ??= n
      if (!isNodeCore(n.callFrame.url)) return n
    }
    return nearest
  }
  /** A WebAssembly function's nearest JavaScript caller: undici for llhttp, PGlite for its PostgreSQL. */
  const jsCallerOf = (id: number): ProfileNode | undefined => {
    for (let p = parent.get(id); p !== undefined; p = parent.get(p)) {
      const n = byId.get(p)!
      if (n.callFrame.url && !n.callFrame.url.startsWith('wasm://')) return n
    }
    return undefined
  }
  const self = new Map<number, number>()
  // timeDeltas[i] is the time before sample i, so sample i's time is timeDeltas[i + 1].
  for (let i = 0; i < profile.samples.length; i++) {
    const id = profile.samples[i]!
    self.set(id, (self.get(id) ?? 0) + (profile.timeDeltas[i + 1] ?? 0) / 1000)
  }
  const modules = new Map<string, number>()
  const charged = new Map<string, number>()
  const functions = new Map<string, { module: string; ms: number }>()
  let idleMs = 0
  let busyMs = 0
  for (const [id, ms] of self) {
    const { functionName, url, lineNumber } = byId.get(id)!.callFrame
    let module = moduleOf(url, functionName)
    let via = ''
    if (module === 'WebAssembly') {
      const caller = jsCallerOf(id)
      if (caller) module = `WebAssembly, from ${moduleOf(caller.callFrame.url, caller.callFrame.functionName)}`
    } else if (module.startsWith('native')) {
      const caller = callerOf(id)
      if (caller) {
        module = `native, from ${moduleOf(caller.callFrame.url, caller.callFrame.functionName)}`
        via = ` ← ${caller.callFrame.functionName || '(anonymous)'}`
      }
    }
    if (module === '(idle)') {
      idleMs += ms
      continue
    }
    busyMs += ms
    modules.set(module, (modules.get(module) ?? 0) + ms)
    const { url: libraryUrl, functionName: libraryFn } = isNodeCore(url) || !url ? (callerOf(id, true)?.callFrame ?? { url: '', functionName }) : { url, functionName }
    const family = module === 'GC' || module.startsWith('(program') ? module
      : module.startsWith('WebAssembly') ? familyOf(module)
      : !libraryUrl || isNodeCore(libraryUrl) ? 'Node core with no library frame above it (event loop, socket reads, timers)'
      : familyOf(moduleOf(libraryUrl, libraryFn))
    charged.set(family, (charged.get(family) ?? 0) + ms)
    const where = url ? `${url.replace(/^.*\/(node_modules|dist)\//, '$1/')}:${lineNumber + 1}` : ''
    const name = `${functionName || '(anonymous)'}${where ? ` ${where}` : ''}${via}`
    const f = functions.get(name) ?? { module, ms: 0 }
    f.ms += ms
    functions.set(name, f)
  }
  const share = (ms: number) => (busyMs > 0 ? ms / busyMs : 0)
  const families = new Map<string, number>()
  for (const [name, ms] of modules) {
    const family = familyOf(name.replace(/^native, from /, ''))
    families.set(family, (families.get(family) ?? 0) + ms)
  }
  const ranked = (m: Map<string, number>) => [...m].map(([name, ms]) => ({ name, ms, share: share(ms) })).sort((a, b) => b.ms - a.ms)
  return {
    busyMs,
    idleMs,
    modules: ranked(modules),
    families: ranked(families),
    charged: ranked(charged),
    functions: [...functions].map(([name, f]) => ({ name, module: f.module, ms: f.ms, share: share(f.ms) })).sort((a, b) => b.ms - a.ms).slice(0, top),
  }
}

export function printSummary(s: Summary, modules = 20): string[] {
  const pct = (x: number) => `${(x * 100).toFixed(1).padStart(5)}%`
  const lines = [`busy ${(s.busyMs / 1000).toFixed(1)} s sampled (idle ${(s.idleMs / 1000).toFixed(1)} s left out); native functions are charged to their nearest caller outside Node's own JS`]
  lines.push('self time by part of the data plane:')
  for (const m of s.families) lines.push(`  ${pct(m.share)}  ${m.name}`)
  lines.push('the same, with Node core (its JS and natives) charged to the library that called into it:')
  for (const m of s.charged) lines.push(`  ${pct(m.share)}  ${m.name}`)
  lines.push('self time by module:')
  for (const m of s.modules.slice(0, modules)) lines.push(`  ${pct(m.share)}  ${m.name}`)
  lines.push('self time by function:')
  for (const f of s.functions) lines.push(`  ${pct(f.share)}  ${f.name}  [${f.module}]`)
  return lines
}

// `node dist/bench/cpuprofile.js FILE.cpuprofile [top]` summarises a profile taken elsewhere.
if (process.argv[1] && import.meta.url.endsWith(process.argv[1].split('/').pop()!) && process.argv[2]) {
  for (const l of printSummary(summarise(process.argv[2], Number(process.argv[3] ?? 25)))) console.log(l)
}
