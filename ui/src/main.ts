import './style.css'
import { token } from './api.js'
import { renderEntity } from './entity.js'
import { renderJobs } from './jobs.js'
import { renderRejections } from './rejections.js'
import { renderRules } from './rules.js'

import type { Screen } from './screen.js'

const screens: Record<string, Screen> = { rejections: renderRejections, entity: renderEntity, jobs: renderJobs, rules: renderRules }
let leave: () => void = () => {}

/** Hash routes: #/rejections?code=…, #/entity/invoice%3A7?tenant=…, #/jobs, #/rules/name. */
function route(): void {
  const hash = location.hash.replace(/^#\/?/, '')
  const [pathPart, query = ''] = hash.split('?', 2) as [string, string?]
  const path = pathPart.split('/').filter(Boolean).map(decodeURIComponent)
  const name = path[0] && screens[path[0]] ? path[0] : 'rejections'
  leave()
  const main = document.getElementById('main')!
  main.replaceChildren()
  for (const a of document.querySelectorAll<HTMLAnchorElement>('nav a')) {
    if (a.dataset.screen === name) a.setAttribute('aria-current', 'page')
    else a.removeAttribute('aria-current')
  }
  leave = screens[name]!(main, path.slice(1), new URLSearchParams(query))
}

function showWho(): void {
  const forget = document.getElementById('forget-token') as HTMLButtonElement
  forget.hidden = token.get() === null
}

document.getElementById('forget-token')!.addEventListener('click', () => {
  token.clear()
  showWho()
  route()
})
document.addEventListener('fencegate:token', showWho)
window.addEventListener('hashchange', () => {
  route()
  document.getElementById('main')!.focus()
})
showWho()
route()
