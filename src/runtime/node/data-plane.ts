import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http'
import { requestIdOf, type HandleCommand } from '../../gateway/app.js'
import type { Answer } from '../../http/exchange.js'
import { problemAnswer } from '../../http/problems.js'
import type { Logger } from '../../observe/log.js'
import { writeAnswer } from './answer.js'
import { headerViewOf, nodeInbound } from './inbound.js'

/**
 * Node's data-plane server: commands go from the socket to the pipeline and back without
 * a Web `Request` or `Response` (those cost a passthrough about as much CPU as the rest of
 * it, `npm run bench -- profile`). Paths under `honoPrefix` (the job API) go to the Hono
 * listener. The raw-target check comes before it (`guardTargets`, src/runtime/node/target.ts).
 *
 * @example
 * const { app, handle } = createDataPlane(deps)
 * createServer(nodeDataPlane({ handle, hono: getRequestListener(app.fetch), honoPrefix: jobsPath, log }))
 */
export function nodeDataPlane(o: { handle: HandleCommand; hono: RequestListener; honoPrefix: string; log: Logger }): RequestListener {
  return (incoming, res) => {
    if (under(incoming.url ?? '', o.honoPrefix)) {
      o.hono(incoming, res)
      return
    }
    serveCommand(o.handle, incoming, res).catch((err: unknown) => {
      // Only writing can fail here (the pipeline answers every failure as a problem).
      o.log.warn('answer_failed', { error: (err as Error)?.name ?? typeof err })
      res.destroy()
    })
  }
}

async function serveCommand(handle: HandleCommand, incoming: IncomingMessage, res: ServerResponse): Promise<void> {
  const headers = headerViewOf(incoming.rawHeaders)
  const requestId = requestIdOf({ headers })
  let answer: Answer
  try {
    answer = await handle(nodeInbound(incoming, headers), requestId)
  } catch (err) {
    answer = problemAnswer(err, requestId)
  }
  // A body refused as too large is not read to its end: the connection closes after the answer.
  if (answer.status === 413 && !incoming.readableEnded) res.shouldKeepAlive = false
  await writeAnswer(answer, res)
}

function under(target: string, prefix: string): boolean {
  if (!target.startsWith(prefix)) return false
  const next = target.charAt(prefix.length)
  return next === '' || next === '/' || next === '?'
}
