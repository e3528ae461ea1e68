import uPlot from 'uplot'
import 'uplot/dist/uPlot.min.css'

// Charts on uPlot. Colours per code are fixed so one code looks the same on every screen.
const palette = ['#c0392b', '#2471a3', '#b9770e', '#7d3c98', '#148f77', '#566573', '#a04000', '#1e8449']
const colours = new Map<string, string>([['stale_fence', palette[0]!], ['fence_required', palette[1]!], ['invalid_fence', palette[2]!], ['lease_expired', palette[3]!]])
export function colourOf(code: string): string {
  if (!colours.has(code)) colours.set(code, palette[colours.size % palette.length]!)
  return colours.get(code)!
}

// Counts and fences are whole numbers: no tick at 1.25.
const wholeSteps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10_000, 100_000, 1_000_000, 1e9, 1e12, 1e15, 1e18]

function widthOf(el: HTMLElement): number {
  return Math.max(320, Math.floor(el.getBoundingClientRect().width) || 800)
}

/** Keeps a chart as wide as its container. */
function follow(el: HTMLElement, plot: uPlot): void {
  const observer = new ResizeObserver(() => plot.setSize({ width: widthOf(el), height: plot.height }))
  observer.observe(el)
}

/**
 * Rejections per bucket, one bar-like series per code, on a time axis.
 * `times` are bucket starts in seconds; `counts` per code, aligned with them.
 */
export function rejectionsChart(el: HTMLElement, times: number[], counts: Map<string, number[]>, stepS: number): uPlot {
  const codes = [...counts.keys()]
  // Each bar starts at its bucket's start; one step of room on the right keeps the newest bucket visible.
  const xRange: uPlot.Range.MinMax = [times[0] ?? 0, (times.at(-1) ?? 0) + stepS]
  const bars = uPlot.paths.bars!({ size: [0.9, 40], align: 1 })
  const opts: uPlot.Options = {
    width: widthOf(el),
    height: 220,
    scales: { x: { time: true, range: () => xRange }, y: { range: (_u, _min, max) => [0, Math.max(1, max)] } },
    axes: [{}, { label: 'rejections', size: 50, incrs: wholeSteps }],
    series: [{}, ...codes.map((code) => ({ label: code, stroke: colourOf(code), fill: `${colourOf(code)}99`, width: 1, paths: bars, points: { show: false } }))],
  }
  const plot = new uPlot(opts, [times, ...codes.map((c) => counts.get(c)!)], el)
  follow(el, plot)
  return plot
}

/**
 * An entity on one time axis: its highest fence as a step line (each accepted change a
 * point) and the fences of refused commands as red crosses below it.
 */
export function fenceChart(el: HTMLElement, history: { t: number; fence: number }[], refused: { t: number; fence: number }[]): uPlot {
  // The newest fence holds until now: carry it to the right edge so the line does not stop short.
  const newest = history.reduce<{ t: number; fence: number } | undefined>((a, p) => (a && a.t >= p.t ? a : p), undefined)
  const lastT = Math.max(...history.map((p) => p.t), ...refused.map((p) => p.t))
  if (newest && lastT > newest.t) history = [...history, { t: lastT, fence: newest.fence }]
  const times = [...new Set([...history.map((p) => p.t), ...refused.map((p) => p.t)])].sort((a, b) => a - b)
  const at = (points: { t: number; fence: number }[]) => {
    const byTime = new Map(points.map((p) => [p.t, p.fence]))
    return times.map((t) => byTime.get(t) ?? null)
  }
  const opts: uPlot.Options = {
    width: widthOf(el),
    height: 220,
    scales: { x: { time: true } },
    axes: [{}, { label: 'fence', size: 60, incrs: wholeSteps }],
    series: [
      {},
      { label: 'highest fence', stroke: '#2471a3', width: 2, spanGaps: true, paths: uPlot.paths.stepped!({ align: 1 }), points: { show: true, size: 8 } },
      { label: 'refused (presented fence)', stroke: '#c0392b', width: 0, paths: () => null, points: { show: true, size: 9, fill: '#c0392b', stroke: '#c0392b' } },
    ],
  }
  const plot = new uPlot(opts, [times, at(history), at(refused)] as uPlot.AlignedData, el)
  follow(el, plot)
  return plot
}
