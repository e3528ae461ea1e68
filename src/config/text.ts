import { parse } from 'yaml'
import { ExpansionError, prepareExpansion, type ReadTextFile } from './expand.js'
import { ConfigError, parseConfig, type Config } from './schema.js'

/**
 * Parses YAML (or JSON) text with `${VAR}` (and, given `readFile`, `${file:…}`) expansion, as configuration and
 * rules files are read. Problems throw a ConfigError naming `source`. No
 * `node:*` import, so the Workers entry reads its binding with it too.
 *
 * @example
 * readExpandedYaml('routes: []\nport: ${PORT:-8080}', process.env, 'fencegate.yaml')
 */
export function readExpandedYaml(text: string, env: Record<string, string | undefined>, source: string, readFile?: ReadTextFile): unknown {
  const expansion = prepareExpansion(text, env, readFile)
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

/**
 * Expands and validates configuration text; `source` names it in errors. `readFile` resolves
 * `${file:…}` (src/config/expand.ts); without it such a reference is an error naming its field.
 *
 * @example
 * loadConfigText(text, process.env, 'fencegate.yaml', (p) => readFileSync(p, 'utf8'))
 */
export function loadConfigText(text: string, env: Record<string, string | undefined>, source = 'config', readFile?: ReadTextFile): Config {
  const raw = readExpandedYaml(text, env, source, readFile)
  try {
    return parseConfig(raw)
  } catch (err) {
    if (err instanceof ConfigError) throw new ConfigError(err.problems.map((p) => `${source}: ${p}`))
    throw err
  }
}
