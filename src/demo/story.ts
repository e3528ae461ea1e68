/**
 * What `npm start` plays once on a fresh store, so the console at /ui/ has something to
 * show: `npm run demo`'s story on invoice 7 without its keys. Worker A captures with
 * fence 1, worker B takes over with fence 2, A wakes up and is refused (stale_fence).
 * A store where invoice 7 already has a fence is left as it is.
 *
 * @example
 * await playDemoStory('http://127.0.0.1:8080', 'http://127.0.0.1:8081')
 */
export async function playDemoStory(dataUrl: string, adminUrl: string): Promise<'played' | 'already'> {
  if ((await fetch(`${adminUrl}/entities/invoice:7`)).status === 200) return 'already'
  let step = 0
  const capture = async (fence: number, worker: string) => {
    step += 1
    const res = await fetch(`${dataUrl}/payments/7/capture`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-execution-fence': String(fence), 'x-request-id': `demo-${step}-${worker}-fence-${fence}` },
      body: JSON.stringify({ amount: 1299 }),
    })
    await res.arrayBuffer()
    return res.status
  }
  await capture(1, 'worker-a')
  await capture(2, 'worker-b')
  await capture(1, 'worker-a')
  return 'played'
}
