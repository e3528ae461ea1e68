import { loadConfigFile } from '../config/load.js'
import { databaseUrlFor, startGateway } from '../runtime/node/gateway.js'
import { createPinoLogger } from '../runtime/node/log.js'
import { installProcessPolicy } from '../runtime/node/process-policy.js'
import { portFlag, stringFlag, type Flags } from './usage.js'

/** `fencegate serve`: runs until SIGINT or SIGTERM, then drains and exits. */
export async function runServe(flags: Flags): Promise<number> {
  const config = loadConfigFile(stringFlag(flags, 'config') ?? 'fencegate.yaml', process.env)
  const port = portFlag(flags, 'port')
  const adminPort = portFlag(flags, 'admin-port')
  if (port !== undefined) config.server.port = port
  if (adminPort !== undefined) config.server.admin_port = adminPort
  const dataDir = stringFlag(flags, 'data-dir')
  if (dataDir !== undefined) config.store.data_dir = dataDir
  // The handlers go in before the gateway starts: a SIGTERM sent as soon as it logs
  // `listening` (an orchestrator, a test) must drain it, not kill it, and one sent while it
  // starts stops it as soon as it is up.
  let shutdown = () => {}
  const stopRequested = new Promise<void>((resolve) => {
    shutdown = () => {
      process.off('SIGINT', shutdown)
      process.off('SIGTERM', shutdown)
      resolve()
    }
  })
  process.on('SIGINT', shutdown)
  process.on('SIGTERM', shutdown)
  const log = createPinoLogger(config.log.level)
  installProcessPolicy(log)
  let gateway: Awaited<ReturnType<typeof startGateway>>
  try {
    gateway = await startGateway({ config, log, databaseUrl: databaseUrlFor(config, stringFlag(flags, 'database-url'), process.env) })
  } catch (err) {
    shutdown()
    throw err
  }
  await stopRequested
  await gateway.close()
  // Everything fencegate opened is closed now. postgres.js 3.4.9 can still open one more
  // socket: a LISTEN connection that was waiting to reconnect when the store closed does so
  // afterwards, and that socket would keep the process alive. The timer is unref'd, so a
  // clean exit is not delayed by it.
  setTimeout(() => process.exit(0), 1000).unref()
  return 0
}
