import type { RequestListener } from 'node:http'
import { requestIdOf } from '../../gateway/app.js'
import { problemAnswer } from '../../http/problems.js'
import { unsafeTarget } from '../../http/target.js'
import { writeAnswer } from './answer.js'
import { headerViewOf } from './inbound.js'

/**
 * A listener behind the raw-target check: an unsafe target is answered `400 invalid_request`
 * before the listener (Node's data plane or a Hono app) parses it. Both planes use it.
 *
 * @example
 * createServer(guardTargets(getRequestListener(app.fetch)))
 */
export function guardTargets(listener: RequestListener): RequestListener {
  return (incoming, res) => {
    const unsafe = unsafeTarget(incoming.url)
    if (!unsafe) return listener(incoming, res)
    const headers = headerViewOf(incoming.rawHeaders)
    void writeAnswer(problemAnswer(unsafe, requestIdOf({ headers }), { accept: headers.get('accept') }), res).catch(() => res.destroy())
  }
}
