import { loadConfigFile } from '../config/load.js'
import { databaseUrlFor, startGateway } from '../node.js'
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
  const gateway = await startGateway({ config, databaseUrl: databaseUrlFor(config, stringFlag(flags, 'database-url'), process.env) })
  await new Promise<void>((resolve) => {
    const shutdown = () => {
      process.off('SIGINT', shutdown)
      process.off('SIGTERM', shutdown)
      resolve()
    }
    process.on('SIGINT', shutdown)
    process.on('SIGTERM', shutdown)
  })
  await gateway.close()
  return 0
}
