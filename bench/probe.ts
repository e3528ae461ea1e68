// Preloaded into the gateway child by the bench (`node --import <this file>`) to explain
// its resident set: every 100 ms it appends one JSON line to $FENCEGATE_BENCH_PROBE with
// what V8 and Node report. It only reads counters; the gateway's code is not changed.
import { appendFileSync } from 'node:fs'
import { getHeapSpaceStatistics, getHeapStatistics } from 'node:v8'
import type { ProbeSample } from './memory.js'

const file = process.env.FENCEGATE_BENCH_PROBE
if (file) {
  const timer = setInterval(() => {
    const m = process.memoryUsage()
    let newSpace = 0
    let oldSpace = 0
    let otherSpaces = 0
    for (const s of getHeapSpaceStatistics()) {
      if (s.space_name === 'new_space') newSpace = s.space_size
      else if (s.space_name === 'old_space') oldSpace = s.space_size
      else otherSpaces += s.space_size
    }
    const sample: ProbeSample = {
      t: Date.now(),
      rss: m.rss,
      heapTotal: m.heapTotal,
      heapUsed: m.heapUsed,
      newSpace,
      oldSpace,
      otherSpaces,
      external: m.external,
      arrayBuffers: m.arrayBuffers,
      malloced: getHeapStatistics().malloced_memory,
      tcp: process.getActiveResourcesInfo().filter((r) => r === 'TCPSocketWrap' || r === 'TCPServerWrap').length,
    }
    try {
      appendFileSync(file, `${JSON.stringify(sample)}\n`)
    } catch {
      clearInterval(timer)
    }
  }, 100)
  timer.unref()
}
