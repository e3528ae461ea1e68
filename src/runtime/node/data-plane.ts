import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http'
import { requestIdOf, type HandleCommand } from '../../gateway/app.js'
import type { Answer } from '../../http/exchange.js'
import { problemAnswer } from '../../http/problems.js'
import type { Logger } from '../../observe/log.js'
import { writeAnswer } from './answer.js'
import { headerViewOf, nodeInbound } from './inbound.js'
import { defaultLingering, lingerOnBody, type Lingering } from './linger.js'

/**
 * Node's data-plane server: commands go from the socket to the pipeline and back without
 * a Web `Request` or `Response` (those cost a passthrough about as much CPU as the rest of
 * it, `npm run bench -- profile`); the job API is served the same way. The raw-target check
 * comes before it (`guardTargets`, src/runtime/node/target.ts). A body refused as too large
 * is read and discarded after its answer, for at most `linger` (`lingerOnBody`).
 *
 * @example
 * const { handle } = createDataPlane(deps)
 * createServer(nodeDataPlane({ handle, log }))
 */
export function nodeDataPlane(o: { handle: HandleCommand; log: Logger; linger?: Lingering }): RequestListener {
  const linger = o.linger ?? defaultLingering
  return (incoming, res) => {
    serveCommand(o.handle, incoming, res, linger).catch((err: unknown) => {
      // Only writing can fail here (the pipeline answers every failure as a problem).
      o.log.warn('answer_failed', { error: (err as Error)?.name ?? typeof err })
      res.destroy()
    })
  }
}

async function serveCommand(handle: HandleCommand, incoming: IncomingMessage, res: ServerResponse, linger: Lingering): Promise<void> {
  const headers = headerViewOf(incoming.rawHeaders)
  const requestId = requestIdOf({ headers })
  let answer: Answer
  try {
    answer = await handle(nodeInbound(incoming, headers, res), requestId)
  } catch (err) {
    answer = problemAnswer(err, requestId, { accept: headers.get('accept') })
  }
  // A body refused as too large was not read to its end: its rest is discarded, for a bounded time.
  if (answer.status === 413) lingerOnBody(incoming, res, linger)
  await writeAnswer(answer, res)
}
