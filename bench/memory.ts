import { readFileSync } from 'node:fs'
import { memoryKiB, resetPeakRss } from './procs.js'

/** One line the probe (bench/probe.ts) appends inside the gateway; bytes unless named otherwise. */
export interface ProbeSample {
  /** Date.now() */
  t: number
  rss: number
  /** V8 heap committed and in use. */
  heapTotal: number
  heapUsed: number
  /** Young generation (semi-spaces) and old generation, as committed. */
  newSpace: number
  oldSpace: number
  /** Everything else V8 committed: code, map, large-object spaces. */
  otherSpaces: number
  /** Memory held outside the V8 heap by JS objects (Buffers, ArrayBuffers). */
  external: number
  arrayBuffers: number
  /** Memory V8 itself got from malloc (not the heap). */
  malloced: number
  /** Open TCP sockets (clients, upstream pool, store pool) and listening servers. */
  tcp: number
}

/** The gateway's memory over one scenario. */
export interface MemoryWindow {
  /** Peak RSS (VmHWM) in KiB; undefined off Linux. */
  peakKiB: number | undefined
  /** True when the peak covers this window only; false when it is the peak since the gateway started. */
  windowed: boolean
  /** The probe sample with the highest RSS in the window, to see what the RSS was made of. */
  atPeak: ProbeSample | undefined
  /** The highest V8 heap in use and the most TCP sockets in any sample of the window. */
  maxHeapUsed: number
  maxTcp: number
  /** The lowest V8 heap in use in any sample: about the live heap, right after a full GC. */
  minHeapUsed: number | undefined
}

export function readProbe(file: string, from = 0, to = Infinity): ProbeSample[] {
  let text: string
  try {
    text = readFileSync(file, 'utf8')
  } catch {
    return []
  }
  const samples: ProbeSample[] = []
  for (const line of text.split('\n')) {
    if (!line) continue
    try {
      const s = JSON.parse(line) as ProbeSample
      if (s.t >= from && s.t <= to) samples.push(s)
    } catch {
      // a line cut short while it was written
    }
  }
  return samples
}

/** Starts a memory window on the gateway: its peak RSS counts from now when the kernel allows. */
export function openWindow(pid: number, probeFile: string): () => MemoryWindow {
  const from = Date.now()
  const windowed = resetPeakRss(pid)
  return () => {
    const samples = readProbe(probeFile, from, Date.now())
    let atPeak: ProbeSample | undefined
    let maxHeapUsed = 0
    let maxTcp = 0
    let minHeapUsed: number | undefined
    for (const s of samples) {
      if (!atPeak || s.rss > atPeak.rss) atPeak = s
      maxHeapUsed = Math.max(maxHeapUsed, s.heapUsed)
      minHeapUsed = Math.min(minHeapUsed ?? Infinity, s.heapUsed)
      maxTcp = Math.max(maxTcp, s.tcp)
    }
    return { peakKiB: memoryKiB(pid, 'VmHWM'), windowed, atPeak, maxHeapUsed, maxTcp, minHeapUsed }
  }
}
