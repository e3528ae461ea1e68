import { spawn, spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { describe, expect, it } from 'vitest'
import { cli } from './helpers/process.js'

/**
 * The Python client's suite (clients/python/tests) against the built gateway: Debian's
 * interpreter and pytest, run as `python -X dev -W error` so a warning (an unclosed socket, a
 * thread's exception) fails it. Skipped with a message when /usr/bin/python3 or its pytest is
 * missing (.ci/run installs python3-pytest).
 */
const python = '/usr/bin/python3'
const root = join(import.meta.dirname, '..')
const pytestMissing = !existsSync(python) || spawnSync(python, ['-c', 'import pytest'], { stdio: 'ignore' }).status !== 0
if (pytestMissing) console.warn(`test/python-client.test.ts skipped: ${python} with pytest is missing (apt-get install python3-pytest)`)

describe.skipIf(pytestMissing)('the Python client (clients/python) against a real gateway', () => {
  it('passes its pytest suite under -X dev -W error, with at least one test collected', async () => {
    expect(existsSync(cli)).toBe(true)
    const run = await new Promise<{ code: number | null; output: string }>((resolve) => {
      // -p no:cacheprovider: the suite writes no .pytest_cache into the tree.
      const child = spawn(python, ['-X', 'dev', '-W', 'error', '-m', 'pytest', 'clients/python/tests', '-q', '-p', 'no:cacheprovider'], {
        cwd: root, env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' },
      })
      let output = ''
      child.stdout.on('data', (c: Buffer) => (output += c))
      child.stderr.on('data', (c: Buffer) => (output += c))
      child.on('close', (code) => resolve({ code, output }))
    })
    // Exit 5 is "no tests collected": only 0 passes, and the summary must name passed tests.
    expect(run.code, run.output).toBe(0)
    expect(run.output).toMatch(/\b\d+ passed\b/)
  }, 300_000)
})
