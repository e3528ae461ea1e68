import { spawn, type ChildProcess } from 'node:child_process'
import { afterEach, describe, expect, it } from 'vitest'
import { timeoutAfterIo } from '../src/store/after-io.js'

/**
 * The supervisor's and the workers' questions to each other (a failover's acknowledged
 * writes: a worker that does not answer in time makes the whole gateway refuse until it is
 * restarted) time out with `timeoutAfterIo`. A real child answers over a real IPC pipe.
 */
let child: ChildProcess | undefined
afterEach(() => {
  child?.kill()
  child = undefined
})

/** A child that answers every message with itself, unless told to keep quiet. */
async function echo(): Promise<ChildProcess> {
  const c = spawn(process.execPath, ['-e', "process.on('message', (m) => m !== 'quiet' && process.send(m))"], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] })
  await new Promise<void>((resolve) => {
    c.once('message', () => resolve())
    c.send('ready?')
  })
  return c
}

/** Asks the child and settles with its answer, or with 'timeout' after `ms`. */
function ask(c: ChildProcess, message: string, ms: number): Promise<string> {
  return new Promise((resolve) => {
    const timer = timeoutAfterIo(() => resolve('timeout'), ms)
    c.once('message', (m) => {
      timer.cancel()
      resolve(`answer ${String(m)}`)
    })
    c.send(message)
  })
}

describe('timeoutAfterIo', () => {
  it('lets an answer that arrived while the process was not scheduled win over the timeout that fell due meanwhile', async () => {
    child = await echo()
    const answer = ask(child, 'acked?', 200)
    // The process held for five times the timeout, as a throttled container is: the answer
    // waits in the pipe and the timer is due when it runs again (a plain setTimeout fired first).
    const until = performance.now() + 1000
    while (performance.now() < until) { /* not scheduled */ }
    expect(await answer).toBe('answer acked?')
  })

  it('still times out a question nobody answers', async () => {
    child = await echo()
    expect(await ask(child, 'quiet', 50)).toBe('timeout')
  })
})
