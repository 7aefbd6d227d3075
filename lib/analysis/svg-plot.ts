/**
 * Line plots as standalone SVG text (no chart library): axes with "nice" ticks (1, 2, 2.5, 5 ×
 * 10^k), tick labels, axis labels, a title, a legend, and one path per series. Non-finite values
 * (a NaN loss) break the line and are counted in the legend; an isolated point gets a marker.
 * Output is deterministic for the same input (coordinates rounded to 0.01 px).
 */

export interface PlotSeries {
  name: string;
  /** [x, y] pairs; sorted by x before drawing. */
  points: ReadonlyArray<readonly [number, number]>;
  color?: string;
  dashed?: boolean;
}

export interface LinePlotSpec {
  /** Used as the svg id (`plot-<id>`) and data-plot attribute. */
  id: string;
  title: string;
  xLabel: string;
  yLabel: string;
  series: readonly PlotSeries[];
  width?: number;
  height?: number;
}

export interface PlotLayout {
  width: number;
  height: number;
  /** Plot area in SVG pixels. */
  left: number;
  right: number;
  top: number;
  bottom: number;
  xDomain: [number, number];
  yDomain: [number, number];
  xTicks: number[];
  yTicks: number[];
}

export const PALETTE = [
  '#1f77b4',
  '#d62728',
  '#2ca02c',
  '#ff7f0e',
  '#9467bd',
  '#8c564b',
  '#e377c2',
  '#17becf',
  '#7f7f7f',
  '#bcbd22',
];

const MARGIN = { left: 64, right: 16, bottom: 46 };
const TITLE_H = 26,
  LEGEND_ROW_H = 14;

interface LegendItem {
  name: string;
  label: string;
  color: string;
  dashed: boolean;
  x: number;
  row: number;
}

/** Legend entries laid out in rows above the plot area (the plot area starts below them). */
function legendLayout(spec: LinePlotSpec, width: number): { items: LegendItem[]; rows: number } {
  const items: LegendItem[] = [];
  const maxX = width - MARGIN.right;
  let x = MARGIN.left,
    row = 0;
  spec.series.forEach((s, i) => {
    const nonFinite = s.points.filter(([px, py]) => !Number.isFinite(px) || !Number.isFinite(py)).length;
    const label = nonFinite > 0 ? `${s.name} (${nonFinite} non-finite)` : s.name;
    const w = 26 + label.length * 6.2;
    if (x + w > maxX && x > MARGIN.left) {
      x = MARGIN.left;
      row++;
    }
    items.push({
      name: s.name,
      label,
      color: s.color ?? PALETTE[i % PALETTE.length],
      dashed: s.dashed ?? false,
      x,
      row,
    });
    x += w + 10;
  });
  return { items, rows: items.length ? row + 1 : 0 };
}

export function escapeXml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

/** A "nice" step near `raw`: 1, 2, 2.5 or 5 times a power of ten. */
export function niceStep(raw: number): number {
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const p = 10 ** Math.floor(Math.log10(raw));
  const f = raw / p;
  const m = f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10;
  return m * p;
}

/**
 * Ticks covering [lo, hi] with about `count` intervals; the returned domain is widened to the
 * outer ticks. A degenerate range (lo = hi) is widened around the value first. `integer` keeps
 * the step ≥ 1 (training steps).
 */
export function niceTicks(
  lo: number,
  hi: number,
  count = 5,
  integer = false,
): { ticks: number[]; domain: [number, number] } {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) {
    lo = 0;
    hi = 1;
  }
  if (hi < lo) [lo, hi] = [hi, lo];
  if (hi === lo) {
    const pad = integer ? 1 : Math.abs(lo) * 0.1 || 1;
    lo -= pad;
    hi += pad;
  }
  let step = niceStep((hi - lo) / Math.max(1, count));
  if (integer) step = Math.max(1, Math.round(step) === step ? step : Math.ceil(step));
  const start = Math.floor(lo / step + 1e-9) * step;
  const end = Math.ceil(hi / step - 1e-9) * step;
  const ticks: number[] = [];
  const n = Math.round((end - start) / step);
  for (let i = 0; i <= n; i++) ticks.push(roundTo(start + i * step, step));
  return { ticks, domain: [ticks[0], ticks[ticks.length - 1]] };
}

/** Removes floating-point noise (0.30000000000000004) relative to the tick step. */
function roundTo(v: number, step: number): number {
  const decimals = Math.max(0, Math.min(12, -Math.floor(Math.log10(step)) + 2));
  const r = Number(v.toFixed(decimals));
  return Object.is(r, -0) ? 0 : r;
}

/** Decimal places of a tick step's shortest text (0.25 → 2, 5 → 0). */
function decimalsOf(step: number): number {
  const t = String(roundTo(step, step));
  const m = /e-(\d+)$/.exec(t);
  if (m) return Number(m[1]) + (t.split('e')[0].split('.')[1]?.length ?? 0);
  return t.split('.')[1]?.length ?? 0;
}

/** Tick label text: as many decimals as the step needs; exponent form for very large or tiny steps. */
export function tickLabel(v: number, step: number): string {
  if (v === 0) return '0';
  if (Math.abs(v) >= 1e6 || step < 1e-4) return v.toExponential(2);
  return v.toFixed(Math.min(8, decimalsOf(step)));
}

const fmt = (v: number) => String(Math.round(v * 100) / 100);

export function plotLayout(spec: LinePlotSpec): PlotLayout {
  const width = spec.width ?? 640,
    height = spec.height ?? 320;
  const top = TITLE_H + legendLayout(spec, width).rows * LEGEND_ROW_H + 8;
  const xs: number[] = [],
    ys: number[] = [];
  for (const s of spec.series)
    for (const [x, y] of s.points) {
      if (Number.isFinite(x) && Number.isFinite(y)) {
        xs.push(x);
        ys.push(y);
      }
    }
  const allIntX = xs.every((x) => Number.isInteger(x));
  const xr = xs.length ? niceTicks(Math.min(...xs), Math.max(...xs), 6, allIntX) : niceTicks(0, 1, 5);
  const yr = ys.length ? niceTicks(Math.min(...ys), Math.max(...ys), 5) : niceTicks(0, 1, 5);
  return {
    width,
    height,
    left: MARGIN.left,
    right: width - MARGIN.right,
    top,
    bottom: height - MARGIN.bottom,
    xDomain: xr.domain,
    yDomain: yr.domain,
    xTicks: xr.ticks,
    yTicks: yr.ticks,
  };
}

export function scaleX(l: PlotLayout, x: number): number {
  return l.left + ((x - l.xDomain[0]) / (l.xDomain[1] - l.xDomain[0])) * (l.right - l.left);
}

export function scaleY(l: PlotLayout, y: number): number {
  return l.bottom - ((y - l.yDomain[0]) / (l.yDomain[1] - l.yDomain[0])) * (l.bottom - l.top);
}

/** Splits a series into runs of finite points (a non-finite y ends a run). */
function segments(points: ReadonlyArray<readonly [number, number]>): Array<Array<readonly [number, number]>> {
  const sorted = points
    .filter(([x]) => Number.isFinite(x))
    .slice()
    .sort((a, b) => a[0] - b[0]);
  const out: Array<Array<readonly [number, number]>> = [];
  let cur: Array<readonly [number, number]> = [];
  for (const p of sorted) {
    if (Number.isFinite(p[1])) cur.push(p);
    else if (cur.length) {
      out.push(cur);
      cur = [];
    }
  }
  if (cur.length) out.push(cur);
  return out;
}

/** Renders one line plot as an `<svg>` element string. */
export function renderLinePlot(spec: LinePlotSpec): string {
  const l = plotLayout(spec);
  const o: string[] = [];
  const hasData = spec.series.some((s) => s.points.some(([x, y]) => Number.isFinite(x) && Number.isFinite(y)));
  o.push(
    `<svg xmlns="http://www.w3.org/2000/svg" id="plot-${escapeXml(spec.id)}" data-plot="${escapeXml(spec.id)}" class="plot" width="${l.width}" height="${l.height}" viewBox="0 0 ${l.width} ${l.height}" role="img" aria-label="${escapeXml(spec.title)}">`,
  );
  o.push(`<title>${escapeXml(spec.title)}</title>`);
  o.push(`<rect x="0" y="0" width="${l.width}" height="${l.height}" fill="#ffffff"/>`);
  o.push(
    `<text class="plot-title" x="${fmt(l.width / 2)}" y="18" text-anchor="middle" font-size="14" font-weight="bold">${escapeXml(spec.title)}</text>`,
  );

  // Grid and ticks.
  const xStep = l.xTicks.length > 1 ? l.xTicks[1] - l.xTicks[0] : 1;
  const yStep = l.yTicks.length > 1 ? l.yTicks[1] - l.yTicks[0] : 1;
  o.push('<g class="grid" stroke="#e5e5e5" stroke-width="1">');
  for (const t of l.yTicks)
    o.push(`<line x1="${fmt(l.left)}" x2="${fmt(l.right)}" y1="${fmt(scaleY(l, t))}" y2="${fmt(scaleY(l, t))}"/>`);
  for (const t of l.xTicks)
    o.push(`<line x1="${fmt(scaleX(l, t))}" x2="${fmt(scaleX(l, t))}" y1="${fmt(l.top)}" y2="${fmt(l.bottom)}"/>`);
  o.push('</g>');
  o.push(
    `<g class="axes" stroke="#333333" stroke-width="1"><line class="x-axis" x1="${fmt(l.left)}" x2="${fmt(l.right)}" y1="${fmt(l.bottom)}" y2="${fmt(l.bottom)}"/><line class="y-axis" x1="${fmt(l.left)}" x2="${fmt(l.left)}" y1="${fmt(l.top)}" y2="${fmt(l.bottom)}"/></g>`,
  );
  o.push('<g class="x-ticks" font-size="11" fill="#333333" text-anchor="middle">');
  for (const t of l.xTicks) {
    const x = fmt(scaleX(l, t));
    o.push(
      `<line x1="${x}" x2="${x}" y1="${fmt(l.bottom)}" y2="${fmt(l.bottom + 4)}" stroke="#333333"/><text class="tick x-tick" x="${x}" y="${fmt(l.bottom + 16)}">${escapeXml(tickLabel(t, xStep))}</text>`,
    );
  }
  o.push('</g>');
  o.push('<g class="y-ticks" font-size="11" fill="#333333" text-anchor="end">');
  for (const t of l.yTicks) {
    const y = fmt(scaleY(l, t));
    o.push(
      `<line x1="${fmt(l.left - 4)}" x2="${fmt(l.left)}" y1="${y}" y2="${y}" stroke="#333333"/><text class="tick y-tick" x="${fmt(l.left - 7)}" y="${fmt(scaleY(l, t) + 4)}">${escapeXml(tickLabel(t, yStep))}</text>`,
    );
  }
  o.push('</g>');
  o.push(
    `<text class="x-label" x="${fmt((l.left + l.right) / 2)}" y="${fmt(l.height - 8)}" text-anchor="middle" font-size="12">${escapeXml(spec.xLabel)}</text>`,
  );
  o.push(
    `<text class="y-label" x="14" y="${fmt((l.top + l.bottom) / 2)}" text-anchor="middle" font-size="12" transform="rotate(-90 14 ${fmt((l.top + l.bottom) / 2)})">${escapeXml(spec.yLabel)}</text>`,
  );

  // Series.
  o.push(
    `<g class="series-group" fill="none" stroke-width="1.8"><clipPath id="clip-${escapeXml(spec.id)}"><rect x="${fmt(l.left)}" y="${fmt(l.top)}" width="${fmt(l.right - l.left)}" height="${fmt(l.bottom - l.top)}"/></clipPath>`,
  );
  spec.series.forEach((s, i) => {
    const color = s.color ?? PALETTE[i % PALETTE.length];
    const segs = segments(s.points);
    const d = segs
      .map((seg) => seg.map(([x, y], k) => `${k === 0 ? 'M' : 'L'}${fmt(scaleX(l, x))} ${fmt(scaleY(l, y))}`).join(' '))
      .join(' ');
    if (d)
      o.push(
        `<path class="series" data-series="${escapeXml(s.name)}" d="${d}" stroke="${color}"${s.dashed ? ' stroke-dasharray="5 3"' : ''} clip-path="url(#clip-${escapeXml(spec.id)})"/>`,
      );
    for (const seg of segs) {
      if (seg.length === 1)
        o.push(
          `<circle class="marker" data-series="${escapeXml(s.name)}" cx="${fmt(scaleX(l, seg[0][0]))}" cy="${fmt(scaleY(l, seg[0][1]))}" r="2.5" fill="${color}" stroke="none"/>`,
        );
    }
  });
  o.push('</g>');
  if (!hasData) {
    o.push(
      `<text class="no-data" x="${fmt((l.left + l.right) / 2)}" y="${fmt((l.top + l.bottom) / 2)}" text-anchor="middle" font-size="13" fill="#888888">no data logged</text>`,
    );
  }

  // Legend: rows between the title and the plot area.
  o.push('<g class="legend" font-size="11" fill="#333333">');
  for (const it of legendLayout(spec, l.width).items) {
    const y = TITLE_H + 10 + it.row * LEGEND_ROW_H;
    o.push(
      `<g class="legend-item" data-series="${escapeXml(it.name)}"><line x1="${fmt(it.x)}" x2="${fmt(it.x + 18)}" y1="${fmt(y - 4)}" y2="${fmt(y - 4)}" stroke="${it.color}" stroke-width="2"${it.dashed ? ' stroke-dasharray="5 3"' : ''}/><text x="${fmt(it.x + 22)}" y="${fmt(y)}">${escapeXml(it.label)}</text></g>`,
    );
  }
  o.push('</g>');
  o.push('</svg>');
  return o.join('\n');
}
