/**
 * Dimension algebra for the graph builder. A dimension is a number (static) or a string
 * (symbolic): an atom such as `'B'` or `'T'`, a product `'B*T'`, `'4*B'`, or a sum `'P+T'`.
 * Strings are kept in a canonical form (factors sorted, coefficients folded) so that `'T*B'`
 * and `'B*T'` compare equal. Atoms starting with `?` are unknown (not materialisable).
 */
export type Dim = number | string;
export type Shape = readonly Dim[];

/** Split `s` at top-level (not parenthesised) occurrences of `sep`. */
function splitTop(s: string, sep: string): string[] {
  const out: string[] = [];
  let depth = 0,
    start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === '(') depth++;
    else if (c === ')') depth--;
    else if (c === sep && depth === 0) {
      out.push(s.slice(start, i));
      start = i + 1;
    }
  }
  out.push(s.slice(start));
  return out;
}

function stripParens(s: string): string {
  while (s.startsWith('(') && s.endsWith(')')) {
    let depth = 0,
      wraps = true;
    for (let i = 0; i < s.length - 1; i++) {
      if (s[i] === '(') depth++;
      else if (s[i] === ')') depth--;
      if (depth === 0) {
        wraps = false;
        break;
      }
    }
    if (!wraps) break;
    s = s.slice(1, -1);
  }
  return s;
}

/** Canonical form of a dimension (numbers stay numbers; `'3'` becomes 3). */
export function canonDim(d: Dim): Dim {
  if (typeof d === 'number') return d;
  const s = stripParens(d.replace(/\s+/g, ''));
  const terms = splitTop(s, '+');
  if (terms.length > 1) {
    let c = 0;
    const names: string[] = [];
    for (const t of terms) {
      const ct = canonDim(t);
      if (typeof ct === 'number') c += ct;
      else names.push(String(ct));
    }
    names.sort();
    if (names.length === 0) return c;
    return c !== 0 ? [...names, String(c)].join('+') : names.join('+');
  }
  const { coef, names } = factors(s);
  return fromFactors(coef, names);
}

function factors(d: Dim): { coef: number; names: string[] } {
  if (typeof d === 'number') return { coef: d, names: [] };
  const s = stripParens(d);
  if (splitTop(s, '+').length > 1) return { coef: 1, names: [`(${canonDim(s)})`] };
  let coef = 1;
  const names: string[] = [];
  for (const part of splitTop(s, '*')) {
    const p = stripParens(part);
    if (/^\d+$/.test(p)) coef *= Number(p);
    else if (splitTop(p, '+').length > 1) names.push(`(${canonDim(p)})`);
    else if (splitTop(p, '*').length > 1) {
      const f = factors(p);
      coef *= f.coef;
      names.push(...f.names);
    } else names.push(p);
  }
  return { coef, names };
}

function fromFactors(coef: number, names: string[]): Dim {
  if (names.length === 0 || coef === 0) return coef;
  const sorted = [...names].sort();
  return (coef !== 1 ? `${coef}*` : '') + sorted.join('*');
}

export function dimMul(a: Dim, b: Dim): Dim {
  if (typeof a === 'number' && typeof b === 'number') return a * b;
  const fa = factors(canonDim(a)),
    fb = factors(canonDim(b));
  return fromFactors(fa.coef * fb.coef, [...fa.names, ...fb.names]);
}

export function dimAdd(a: Dim, b: Dim): Dim {
  if (typeof a === 'number' && typeof b === 'number') return a + b;
  if (a === 0) return canonDim(b);
  if (b === 0) return canonDim(a);
  const wrap = (d: Dim) => String(canonDim(d));
  return canonDim(`${wrap(a)}+${wrap(b)}`);
}

/** Exact division where it is visible from the factors (e.g. `'4*B*T' / 4`, `'B*T' / 'T'`), else undefined. */
export function dimDiv(a: Dim, b: Dim): Dim | undefined {
  if (typeof a === 'number' && typeof b === 'number') return a % b === 0 ? a / b : undefined;
  const fa = factors(canonDim(a)),
    fb = factors(canonDim(b));
  if (fb.coef === 0 || fa.coef % fb.coef !== 0) return undefined;
  const names = [...fa.names];
  for (const n of fb.names) {
    const i = names.indexOf(n);
    if (i < 0) return undefined;
    names.splice(i, 1);
  }
  return fromFactors(fa.coef / fb.coef, names);
}

export function dimEq(a: Dim, b: Dim): boolean {
  return canonDim(a) === canonDim(b);
}

export function numel(shape: Shape): Dim {
  return shape.reduce<Dim>((p, d) => dimMul(p, d), 1);
}

export function shapeEq(a: Shape, b: Shape): boolean {
  return a.length === b.length && a.every((d, i) => dimEq(d, b[i]));
}

export function fmtShape(s: Shape): string {
  return `[${s.join(', ')}]`;
}

/** True for a single symbolic name (not a product or sum). */
export function isAtom(d: Dim): d is string {
  return typeof d === 'string' && /^[A-Za-z_?][A-Za-z0-9_.?]*$/.test(d);
}

/** Whether a dim is fully known (parseable into atoms, numbers, products and sums) and not unknown (`?`). */
export function isKnown(d: Dim): boolean {
  return typeof d === 'number' || !String(d).includes('?');
}

/** Parsed structure used to materialise a dim at runtime. */
export type DimExpr =
  { kind: 'num'; v: number } | { kind: 'atom'; name: string } | { kind: 'mul' | 'add'; args: DimExpr[] };

export function parseDim(d: Dim): DimExpr {
  const c = canonDim(d);
  if (typeof c === 'number') return { kind: 'num', v: c };
  const s = stripParens(c);
  const terms = splitTop(s, '+');
  if (terms.length > 1) return { kind: 'add', args: terms.map(parseDim) };
  const parts = splitTop(s, '*');
  if (parts.length > 1) return { kind: 'mul', args: parts.map(parseDim) };
  if (/^-?\d+$/.test(s)) return { kind: 'num', v: Number(s) };
  return { kind: 'atom', name: s };
}
