import { readFileSync } from 'node:fs'
import { ConfigError, type Config } from './schema.js'
import { loadConfigText } from './text.js'

export { loadConfigText } from './text.js'

/**
 * Reads, expands (`${VAR}`, `${file:/path}`) and validates a YAML configuration file. Any problem throws a
 * ConfigError naming the file and each bad field: fencegate never starts on a
 * configuration it had to guess about.
 *
 * @example
 * const config = loadConfigFile('fencegate.yaml', process.env)
 */
export function loadConfigFile(path: string, env: Record<string, string | undefined>): Config {
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch (err) {
    throw new ConfigError([`${path}: cannot read (${(err as NodeJS.ErrnoException).code ?? 'error'})`])
  }
  // `${file:…}` is read here, at start, like the file itself (src/config/expand.ts).
  return loadConfigText(text, env, path, (file) => readFileSync(file, 'utf8'))
}
