// `npm start`: the demo upstream on 127.0.0.1:9001 and the gateway with the example configuration.
import { runServe } from '../src/cli/serve.js'
import { startDemoUpstream } from '../src/demo/upstream.js'

const upstream = await startDemoUpstream(9001)
console.log(JSON.stringify({ event: 'demo_upstream_listening', url: upstream.url }))
const code = await runServe({ config: 'fencegate.example.yaml' })
await upstream.close()
process.exitCode = code
