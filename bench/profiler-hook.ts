// Preloaded into a gateway by `npm run bench -- profile` (`node --import <this file>`): the
// first SIGUSR2 starts V8's CPU profiler in-process (node:inspector, the profiler behind
// `node --cpu-prof`), the second stops it and writes $FENCEGATE_BENCH_CPUPROFILE, so the
// profile covers the measured load only, not start-up, migrations or the warm-up.
import { writeFileSync } from 'node:fs'
import { Session } from 'node:inspector'

const file = process.env.FENCEGATE_BENCH_CPUPROFILE
if (file) {
  const session = new Session()
  session.connect()
  let running = false
  process.on('SIGUSR2', () => {
    if (!running) {
      running = true
      session.post('Profiler.enable', () => session.post('Profiler.start'))
      return
    }
    running = false
    session.post('Profiler.stop', (err, result) => {
      writeFileSync(`${file}.tmp`, err ? JSON.stringify({ error: String(err) }) : JSON.stringify(result.profile))
      // Renamed when whole, so the bench never reads a half-written file.
      void import('node:fs').then((fs) => fs.renameSync(`${file}.tmp`, file))
    })
  })
}
