import type { IncomingMessage, ServerResponse } from 'node:http'

/** How long a refused body is read and discarded after its answer (nginx's lingering_time and lingering_timeout). */
export interface Lingering {
  /** At most this long in all. */
  timeMs: number
  /** At most this long without a byte from the client. */
  timeoutMs: number
}

/** The defaults of `server.lingering_time` and `server.lingering_timeout`, as nginx's. */
export const defaultLingering: Lingering = { timeMs: 30_000, timeoutMs: 5_000 }

/**
 * For an answer to a request whose body was not read to its end (a `413 body_too_large`
 * refused on its declared length, or one that went over the limit): reads the rest of the body
 * and discards it, so that the client, still writing, is not reset before it read the answer.
 * A connection closed with unread bytes sends a TCP reset, and the client's kernel then drops
 * the answer it had not read yet: Node's http client reported EPIPE, never the 413.
 *
 * A connection kept alive serves its next request once the body ended. One that closes (the
 * client sent `Connection: close`) gets Node's half close after the answer, and is destroyed
 * once the body ended (or the client closed); Node would destroy it as soon as the answer was
 * written.
 * Either way a client that keeps sending longer than `timeMs` in all, or pauses longer than
 * `timeoutMs`, is cut off. Call it before writing the answer, so it sees the answer finish.
 *
 * @example
 * if (answer.status === 413) lingerOnBody(incoming, res, defaultLingering)
 * await writeAnswer(answer, res)
 */
export function lingerOnBody(incoming: IncomingMessage, res: ServerResponse, linger: Lingering): void {
  if (incoming.readableEnded || incoming.destroyed) return
  const socket = incoming.socket
  let idle: NodeJS.Timeout | undefined
  let closing = false
  const stop = () => {
    clearTimeout(total)
    clearTimeout(idle)
    socket.off('close', stop)
    incoming.off('data', touch).off('end', ended)
  }
  const cut = () => {
    stop()
    socket.destroy()
  }
  const touch = () => {
    clearTimeout(idle)
    idle = setTimeout(cut, linger.timeoutMs).unref()
  }
  // Read to its end: a kept-alive connection is in step again; a closing one closes now that no
  // byte is left unread (once the answer is written, as Node's destroySoon would have).
  const ended = () => {
    stop()
    if (!closing) return
    if (socket.writableFinished) socket.destroy()
    else socket.once('finish', () => socket.destroy())
  }
  const total = setTimeout(cut, linger.timeMs).unref()
  // Node's own 'finish' listener ran first: for a connection that closes it called destroySoon(),
  // which ends the socket (the half close) and destroys it once written. While body bytes are
  // still coming, the destroy waits here for their end.
  res.once('finish', () => {
    if (incoming.readableEnded || socket.destroyed) return
    closing = socket.listeners('finish').includes(socket.destroy)
    if (closing) socket.removeListener('finish', socket.destroy)
    // Node's dump of an unread request removed its 'data' listeners, this one too.
    if (!incoming.listeners('data').includes(touch)) incoming.on('data', touch)
  })
  // The request's data, not the socket's: Node's parser reads the socket without 'data' events.
  incoming.on('data', touch).once('end', ended)
  socket.once('close', stop)
  touch()
  // A body read stopped at the limit was paused; it must flow for its bytes to be read.
  incoming.resume()
}
