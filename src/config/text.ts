import { parse } from 'yaml'
import { ExpansionError, prepareExpansion } from './expand.js'
import { ConfigError, parseConfig, type Config } from './schema.js'

/**
 * Parses YAML (or JSON) text with `${VAR}` expansion, as configuration and
 * rules files are read. Problems throw a ConfigError naming `source`. No
 * `node:*` import, so the Workers entry reads its binding with it too.
 *
 * @example
 * readExpandedYaml('routes: []\nport: ${PORT:-8080}', process.env, 'fencegate.yaml')
 */
export function readExpandedYaml(text: string, env: Record<string, string | undefined>, source: string): unknown {
  const expansion = prepareExpansion(text, env)
  let raw: unknown
  try {
    raw = parse(expansion.text, { prettyErrors: true })
  } catch (err) {
    throw new ConfigError([`${source}: not valid YAML: ${(err as Error).message.split('\n')[0]}`])
  }
  try {
    return expansion.restore(raw)
  } catch (err) {
    if (err instanceof ExpansionError) throw new ConfigError([`${source}: ${err.message}`])
    throw err
  }
}

/** Expands and validates configuration text; `source` names it in errors. */
export function loadConfigText(text: string, env: Record<string, string | undefined>, source = 'config'): Config {
  const raw = readExpandedYaml(text, env, source)
  try {
    return parseConfig(raw)
  } catch (err) {
    if (err instanceof ConfigError) throw new ConfigError(err.problems.map((p) => `${source}: ${p}`))
    throw err
  }
}
