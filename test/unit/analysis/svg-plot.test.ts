import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  niceStep,
  niceTicks,
  plotLayout,
  renderLinePlot,
  scaleX,
  scaleY,
  tickLabel,
  type LinePlotSpec,
} from '../../../lib/analysis/svg-plot.ts';

/** The points of every `M x y L x y …` path, per series name, split at each M. */
function paths(svg: string): Map<string, number[][][]> {
  const out = new Map<string, number[][][]>();
  for (const m of svg.matchAll(/<path class="series" data-series="([^"]*)" d="([^"]*)"/g)) {
    const segs = m[2]
      .split('M')
      .filter(Boolean)
      .map((seg) =>
        seg
          .trim()
          .split(' L')
          .map((p) => p.trim().split(' ').map(Number)),
      );
    out.set(m[1], segs);
  }
  return out;
}

const texts = (svg: string, cls: string) =>
  [...svg.matchAll(new RegExp(`<text class="${cls}"[^>]*>([^<]*)</text>`, 'g'))].map((m) => m[1]);

test('nice steps and ticks cover the data with round numbers', () => {
  assert.equal(niceStep(0.17), 0.2);
  assert.equal(niceStep(0.23), 0.25);
  assert.equal(niceStep(3), 5);
  assert.equal(niceStep(7), 10);
  assert.equal(niceStep(1), 1);
  const t = niceTicks(0.13, 0.92, 5);
  assert.deepEqual(t.ticks, [0, 0.2, 0.4, 0.6, 0.8, 1]);
  assert.deepEqual(t.domain, [0, 1]);
  // Integer axes never get fractional steps; a single value is widened around itself.
  assert.deepEqual(niceTicks(1, 3, 6, true).ticks, [1, 2, 3]);
  assert.deepEqual(niceTicks(5, 5, 5, true).domain, [4, 6]);
  const flat = niceTicks(2, 2, 5);
  assert.ok(flat.domain[0] < 2 && flat.domain[1] > 2);
  assert.equal(tickLabel(0.4, 0.2), '0.4');
  assert.equal(tickLabel(0.25, 0.25), '0.25');
  assert.equal(tickLabel(1500, 500), '1500');
  assert.equal(tickLabel(2e6, 1e6), '2.00e+6');
});

test('a line plot maps known data onto the axes, with ticks, labels, title and legend', () => {
  const spec: LinePlotSpec = {
    id: 'reward',
    title: 'Reward <train>',
    xLabel: 'step',
    yLabel: 'reward',
    series: [
      {
        name: 'reward/mean',
        points: [
          [3, 0.6],
          [1, 0.2],
          [2, 0.4],
          [4, 0.8],
          [5, 1.0],
        ],
      },
      {
        name: 'reward/max',
        points: [
          [1, 0.5],
          [5, 1.0],
        ],
        dashed: true,
      },
    ],
  };
  const svg = renderLinePlot(spec);
  assert.match(svg, /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg" id="plot-reward" data-plot="reward"/);
  assert.ok(svg.endsWith('</svg>'));
  assert.match(svg, /<text class="plot-title"[^>]*>Reward &lt;train&gt;<\/text>/, 'title is escaped');
  assert.deepEqual(texts(svg, 'x-label'), ['step']);
  assert.deepEqual(texts(svg, 'y-label'), ['reward']);
  assert.deepEqual(texts(svg, 'tick x-tick'), ['1', '2', '3', '4', '5']);
  assert.deepEqual(texts(svg, 'tick y-tick'), ['0.2', '0.4', '0.6', '0.8', '1.0']);
  assert.match(svg, /<g class="legend-item" data-series="reward\/mean">/);
  assert.match(svg, /<g class="legend-item" data-series="reward\/max">.*stroke-dasharray/);

  const l = plotLayout(spec);
  const p = paths(svg);
  const mean = p.get('reward/mean')!;
  assert.equal(mean.length, 1, 'one unbroken segment');
  assert.equal(mean[0].length, 5, 'one point per data point');
  // Points are sorted by step and land exactly on the scaled coordinates.
  const expected = [
    [1, 0.2],
    [2, 0.4],
    [3, 0.6],
    [4, 0.8],
    [5, 1.0],
  ].map(([x, y]) => [scaleX(l, x), scaleY(l, y)]);
  mean[0].forEach(([x, y], i) => {
    assert.ok(
      Math.abs(x - expected[i][0]) < 0.01 && Math.abs(y - expected[i][1]) < 0.01,
      `point ${i}: ${x},${y} vs ${expected[i]}`,
    );
  });
  // The first step sits on the left edge of the plot area, the last on the right; y grows upwards.
  assert.ok(Math.abs(mean[0][0][0] - l.left) < 0.01);
  assert.ok(Math.abs(mean[0][4][0] - l.right) < 0.01);
  assert.ok(Math.abs(mean[0][0][1] - l.bottom) < 0.01, 'the minimum is on the x axis');
  assert.ok(Math.abs(mean[0][4][1] - l.top) < 0.01, 'the maximum is at the top');
  assert.equal(p.get('reward/max')![0].length, 2);
});

test('non-finite values break the line, are counted in the legend; isolated points get a marker', () => {
  const svg = renderLinePlot({
    id: 'loss',
    title: 'loss',
    xLabel: 'step',
    yLabel: 'loss',
    series: [
      {
        name: 'actor/pg_loss',
        points: [
          [1, 1],
          [2, 2],
          [3, Number.NaN],
          [4, 3],
          [5, Number.POSITIVE_INFINITY],
          [6, 2],
          [7, 1],
        ],
      },
    ],
  });
  const segs = paths(svg).get('actor/pg_loss')!;
  assert.deepEqual(
    segs.map((s) => s.length),
    [2, 1, 2],
  );
  assert.equal((svg.match(/<circle class="marker"/g) ?? []).length, 1, 'the lone point at step 4 has a marker');
  assert.match(svg, />actor\/pg_loss \(2 non-finite\)</);
  assert.doesNotMatch(svg, /d="[^"]*(NaN|Infinity)/, 'no non-finite coordinates');
});

test('a plot without data still renders its frame and says so', () => {
  const svg = renderLinePlot({
    id: 'clipfrac',
    title: 'PPO clip fraction',
    xLabel: 'step',
    yLabel: 'fraction',
    series: [],
  });
  assert.match(svg, /data-plot="clipfrac"/);
  assert.match(svg, /class="no-data"[^>]*>no data logged</);
  assert.equal(paths(svg).size, 0);
  assert.match(svg, /class="x-axis"/);
});

test('many series wrap the legend onto more rows and push the plot area down', () => {
  const series = Array.from({ length: 12 }, (_, i) => ({
    name: `stage_number_${i}`,
    points: [
      [0, i],
      [1, i + 1],
    ] as Array<[number, number]>,
  }));
  const one = plotLayout({ id: 'a', title: 't', xLabel: 'x', yLabel: 'y', series: series.slice(0, 1) });
  const many = plotLayout({ id: 'b', title: 't', xLabel: 'x', yLabel: 'y', series });
  assert.ok(many.top > one.top);
  const svg = renderLinePlot({ id: 'b', title: 't', xLabel: 'x', yLabel: 'y', series });
  assert.equal(paths(svg).size, 12);
  // Series colours cycle through the palette but every series has its own path.
  assert.equal(new Set([...svg.matchAll(/<path class="series"[^>]* stroke="([^"]+)"/g)].map((m) => m[1])).size, 10);
});
