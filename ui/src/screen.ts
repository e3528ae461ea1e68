/** A screen draws into `main` and returns what stops its timers when the reader leaves it. */
export type Screen = (main: HTMLElement, path: string[], params: URLSearchParams) => () => void
