/**
 * Whether `text` matches the glob `pattern`, where `*` stands for any run of characters (the
 * empty run, `:` and any other character included) and every other character stands for
 * itself. Characters are UTF-16 code units, as `String.prototype` counts them.
 *
 * Bounded work, without backtracking across stars: at most `text.length × pattern.length`
 * comparisons (linear in the text for a given pattern), whatever the number of stars. A pattern compiled to a regular expression (`.*` per star) backtracks instead: an
 * operator's `*a*a*a*a*a*a*b` against a client's 128-character `aaa…a` tries every way of
 * splitting the text among the stars, and held the event loop for minutes. Here a mismatch
 * after a star only moves that star's run on by one: the stars before it never need to be
 * tried again, because a later star can absorb whatever a longer earlier run would have.
 *
 * @example
 * globMatches('invoice:*', 'invoice:42') // true
 * globMatches('*:42', 'acme:invoice:42') // true: `*` crosses `:`
 * globMatches('invoice:*', 'invoices:1') // false
 */
export function globMatches(pattern: string, text: string): boolean {
  let p = 0
  let t = 0
  // The last star seen, and where in the text its run ends so far; -1 before any star.
  let star = -1
  let runEnd = 0
  while (t < text.length) {
    if (p < pattern.length && pattern.charCodeAt(p) === 42 /* * */) {
      star = p++
      runEnd = t
    } else if (p < pattern.length && pattern.charCodeAt(p) === text.charCodeAt(t)) {
      p++
      t++
    } else if (star >= 0) {
      // Let the last star take one more character and match the rest of the pattern from there.
      p = star + 1
      t = ++runEnd
    } else {
      return false
    }
  }
  while (p < pattern.length && pattern.charCodeAt(p) === 42) p++
  return p === pattern.length
}
