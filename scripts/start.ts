// `npm start`: the demo upstream on 127.0.0.1:9001 and the gateway with the example configuration.
// Once the admin plane answers, it plays the demo's story on invoice 7 (once per store), so the
// console at http://127.0.0.1:8081/ui/ opens on a rejected command and a fence history.
import { runServe } from '../src/cli/serve.js'
import { playDemoStory } from '../src/demo/story.js'
import { startDemoUpstream } from '../src/demo/upstream.js'

const upstream = await startDemoUpstream(9001)
console.log(JSON.stringify({ event: 'demo_upstream_listening', url: upstream.url }))
const serving = runServe({ config: 'fencegate.example.yaml' })
void (async () => {
  // Start-up takes a moment (migrations); a failed start ends runServe, which ends this wait too.
  for (let i = 0; i < 300; i++) {
    const up = await fetch('http://127.0.0.1:8081/health').then((r) => r.ok, () => false)
    if (up) {
      const story = await playDemoStory('http://127.0.0.1:8080', 'http://127.0.0.1:8081').catch(() => 'failed')
      console.log(JSON.stringify({ event: 'demo_story', result: story, console: 'http://127.0.0.1:8081/ui/' }))
      return
    }
    await new Promise((r) => setTimeout(r, 100))
  }
})()
const code = await serving
await upstream.close()
process.exitCode = code
