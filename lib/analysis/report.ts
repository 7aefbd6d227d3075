/**
 * `rlstream report`: one self-contained HTML file (inline CSS and SVG, no scripts, no external
 * resources) with a summary table and line plots of a run — reward, validation accuracy, KL,
 * entropy, response length, clipfrac, and step time by stage — plus, for a run with prompt
 * images, a few validation images of the last round with the policy's answers (inline PNG data
 * URLs), a few multi-turn episodes as conversations, checkpoints, reward failures and dead letters. Everything is read through read-only queries on the store and its views.
 */
import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import type { Database } from '../db/database.ts';
import { formatNumber } from '../console/progress.ts';
import { RlError } from '../errors.ts';
import { queryObjects } from './query.ts';
import { listRunsInDatabase, type RunSummary } from './runs.ts';
import { escapeXml, renderLinePlot, type PlotSeries } from './svg-plot.ts';

type Points = Array<[number, number]>;

export interface ReportData {
  run: RunSummary;
  /** Metric name → [step, value] sorted by step (the plotted metrics, perf/step_time_s/* and timing/*). */
  metrics: Map<string, Points>;
  /** Train response length per step (v_response_length). */
  responseLength: Array<{ step: number; p50: number; p90: number; max: number; mean: number; truncated: number }>;
  checkpoints: Array<{
    step: number;
    policyVersion: number;
    sha256: string;
    path: string;
    createdAt: string;
    matchesParent: boolean | null;
  }>;
  rewardFailures: Array<{ reason: string; n: number }>;
  rewardFailuresTotal: number;
  filtered: Array<{ reason: string; groups: number }>;
  deadLetters: Array<{
    stage: string;
    topic: string;
    partition: number;
    offset: number;
    reason: string;
    createdAt: string;
  }>;
  deadLettersTotal: number;
  staleness: { mean: number | null; max: number | null };
  /** Up to VAL_IMAGES validation samples of the last validation round with a prompt image: the image (PNG, base64) and the answer. */
  valImages: Array<{
    step: number;
    promptIndex: number;
    width: number;
    height: number;
    pngBase64: string;
    response: string;
    groundTruth: string | null;
    reward: number | null;
  }>;
  /** Up to REPORT_EPISODES multi-turn episodes of the last round that has them (validation first), as conversations. */
  episodes: ReportEpisode[];
  /**
   * An image policy's training samples: up to GENERATED_STEPS steps spread over the run (first and
   * last included), each with its first GENERATED_PER_STEP generated images, prompt and reward.
   */
  generated: Array<{
    step: number;
    images: Array<{ prompt: string; reward: number | null; width: number; height: number; pngBase64: string }>;
  }>;
}

/** One multi-turn episode as a conversation (episodes + episode_turns). */
export interface ReportEpisode {
  trajectoryId: string;
  step: number;
  kind: string;
  prompt: string | null;
  outcome: 'done' | 'cut' | 'failed';
  failure: string | null;
  reward: number;
  assistantTurns: number;
  turns: Array<{
    role: string;
    text: string;
    toolName: string | null;
    arguments: string | null;
    error: string | null;
    reward: number;
    latencyMs: number;
  }>;
}

/** How many episodes the report shows. */
export const REPORT_EPISODES = 4;

/** How many validation images the report shows. */
export const VAL_IMAGES = 8;
export const GENERATED_STEPS = 6;
export const GENERATED_PER_STEP = 8;

/** Up to `k` of the sorted `steps`, evenly spread, the first and last included. */
export function spreadSteps(steps: readonly number[], k: number): number[] {
  if (steps.length <= k) return [...steps];
  return [...new Set(Array.from({ length: k }, (_, i) => steps[Math.round((i * (steps.length - 1)) / (k - 1))]!))];
}

/** The plots of a report, in order: id, title, y label and how to build its series. */
export const REPORT_PLOTS = [
  { id: 'reward', title: 'Reward (train)', yLabel: 'reward' },
  { id: 'val_accuracy', title: 'Validation accuracy', yLabel: 'accuracy / score' },
  { id: 'kl', title: 'KL divergence to the reference', yLabel: 'KL' },
  { id: 'entropy', title: 'Policy entropy', yLabel: 'entropy (nats/token)' },
  { id: 'response_length', title: 'Response length', yLabel: 'tokens' },
  { id: 'clipfrac', title: 'PPO clip fraction', yLabel: 'fraction clipped' },
  { id: 'step_time', title: 'Step time by stage', yLabel: 'seconds' },
] as const;

export type ReportPlotId = (typeof REPORT_PLOTS)[number]['id'];

const PLOTTED = [
  'reward/mean',
  'reward/max',
  'reward/min',
  'val/accuracy',
  'val/reward_score',
  'kl/mean',
  'actor/approx_kl',
  'actor/ppo_kl',
  'actor/entropy',
  'response_length/mean',
  'actor/clipfrac',
];
const STEP_TIME_PREFIX = 'perf/step_time_s/';
const STAGE_ORDER = ['controller', 'rollout', 'reward', 'advantage', 'update'];
const stageRank = (s: string) => (STAGE_ORDER.includes(s) ? STAGE_ORDER.indexOf(s) : STAGE_ORDER.length);
/** Pipeline order, then by name. */
const stageOrder = (a: string, b: string) => stageRank(a) - stageRank(b) || a.localeCompare(b);

/** Reads everything the report shows for one run. */
export async function loadReportData(database: Database, runId: string): Promise<ReportData> {
  const [run] = await listRunsInDatabase(database, null, runId);
  if (!run) throw new RlError(`run ${JSON.stringify(runId)} is not in ${database.where}`, { code: 'ERR_UNKNOWN_RUN' });
  const metrics = new Map<string, Points>();
  const rows = await queryObjects<{ name: string; step: number; value: number }>(
    database,
    `select name, step, value from step_metrics
     where run_id = $1 and (name = any($2::text[]) or name like 'perf/step\\_time\\_s/%' or name like 'timing/%')
     order by name, step`,
    [runId, PLOTTED],
  );
  for (const r of rows) {
    let pts = metrics.get(r.name);
    if (!pts) metrics.set(r.name, (pts = []));
    pts.push([r.step, r.value]);
  }
  const responseLength = (
    await queryObjects<any>(
      database,
      `select step, p50_len, p90_len, max_len, mean_len, n_truncated from v_response_length
     where run_id = $1 and kind = 'train' order by step`,
      [runId],
    )
  ).map((r) => ({
    step: r.step,
    p50: r.p50_len,
    p90: r.p90_len,
    max: r.max_len,
    mean: r.mean_len,
    truncated: r.n_truncated,
  }));
  const checkpoints = (
    await queryObjects<any>(
      database,
      `select step, policy_version, sha256, path, to_char(created_at at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS') as created_at, matches_parent
     from v_checkpoint_lineage where run_id = $1 order by step`,
      [runId],
    )
  ).map((r) => ({
    step: r.step,
    policyVersion: r.policy_version,
    sha256: r.sha256,
    path: r.path,
    createdAt: r.created_at,
    matchesParent: r.matches_parent,
  }));
  const rewardFailures = (
    await queryObjects<any>(
      database,
      `select reward_failure as reason, count(*) as n from v_reward_failures where run_id = $1
     group by reward_failure order by count(*) desc, reward_failure limit 20`,
      [runId],
    )
  ).map((r) => ({ reason: r.reason, n: r.n }));
  const [fc] = await queryObjects<any>(database, 'select count(*) as n from v_reward_failures where run_id = $1', [
    runId,
  ]);
  const filtered = (
    await queryObjects<any>(
      database,
      `select coalesce(filter_reason, '(no reason recorded)') as reason, count(*) as groups from v_filtered_groups
     where run_id = $1 group by 1 order by 2 desc, 1 limit 20`,
      [runId],
    )
  ).map((r) => ({ reason: r.reason, groups: r.groups }));
  const deadLetters = (
    await queryObjects<any>(
      database,
      `select stage, source_topic, source_partition, source_offset, reason, to_char(created_at at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS') as created_at
     from v_dead_letters where run_id = $1 order by created_at, source_topic, source_partition, source_offset limit 50`,
      [runId],
    )
  ).map((r) => ({
    stage: r.stage,
    topic: r.source_topic,
    partition: r.source_partition,
    offset: r.source_offset,
    reason: r.reason,
    createdAt: r.created_at,
  }));
  const [dl] = await queryObjects<any>(database, 'select count(*) as n from v_dead_letters where run_id = $1', [runId]);
  const [st] = await queryObjects<any>(
    database,
    `select avg(staleness)::float8 as mean, max(staleness) as max from trajectories where run_id = $1 and kind = 'train'`,
    [runId],
  );
  // the last validation round that had images; its first prompts, each with its first image
  const valImages = (
    await queryObjects<any>(
      database,
      `with r as (select max(step) as step from trajectories where run_id = $1 and kind = 'val' and cardinality(image_hashes) > 0)
     select t.step, t.prompt_index, t.response_text, t.ground_truth, t.reward, i.width, i.height, encode(i.png, 'base64') as png
     from trajectories t join r on t.step = r.step
     join prompt_images i on i.run_id = t.run_id and i.hash = t.image_hashes[1]
     where t.run_id = $1 and t.kind = 'val' order by t.prompt_index, t.sample_index limit ${VAL_IMAGES}`,
      [runId],
    )
  ).map((r) => ({
    step: r.step,
    promptIndex: r.prompt_index,
    width: r.width,
    height: r.height,
    pngBase64: String(r.png).replace(/\s+/g, ''),
    response: r.response_text,
    groundTruth: r.ground_truth,
    reward: r.reward,
  }));
  const episodes = await loadReportEpisodes(database, runId);
  const genSteps = spreadSteps(
    (
      await queryObjects<any>(
        database,
        `select distinct step from trajectories where run_id = $1 and kind = 'train' and generated_image_hash is not null order by step`,
        [runId],
      )
    ).map((r) => Number(r.step)),
    GENERATED_STEPS,
  );
  const genRows = genSteps.length
    ? await queryObjects<any>(
        database,
        `select step, prompt_text, reward, width, height, png from (
         select t.step, t.prompt_text, t.reward, i.width, i.height, encode(i.png, 'base64') as png,
                row_number() over (partition by t.step order by t.prompt_index, t.sample_index) as k
         from trajectories t join prompt_images i on i.run_id = t.run_id and i.hash = t.generated_image_hash
         where t.run_id = $1 and t.kind = 'train' and t.step = any($2::int[])) s
       where k <= ${GENERATED_PER_STEP} order by step, k`,
        [runId, genSteps],
      )
    : [];
  const generated = genSteps.map((step) => ({
    step,
    images: genRows
      .filter((r) => Number(r.step) === step)
      .map((r) => ({
        prompt: r.prompt_text ?? '',
        reward: r.reward,
        width: r.width,
        height: r.height,
        pngBase64: String(r.png).replace(/\s+/g, ''),
      })),
  }));
  return {
    run,
    metrics,
    responseLength,
    checkpoints,
    rewardFailures,
    rewardFailuresTotal: Number(fc?.n ?? 0),
    filtered,
    deadLetters,
    deadLettersTotal: Number(dl?.n ?? 0),
    staleness: { mean: st?.mean ?? null, max: st?.max ?? null },
    valImages,
    generated,
    episodes,
  };
}

/**
 * The first REPORT_EPISODES episodes (by trajectory id) of the last step that has episodes,
 * validation rounds before training steps, with their turns in order.
 */
async function loadReportEpisodes(database: Database, runId: string): Promise<ReportEpisode[]> {
  const eps = await queryObjects<any>(
    database,
    `with last as (
       select kind, max(step) as step from episodes where run_id = $1 group by kind
       order by case kind when 'val' then 0 else 1 end limit 1)
     select e.trajectory_id, e.step, e.kind, e.assistant_turns, e.reward, e.done, e.failure, t.prompt_text
     from episodes e join last l on e.kind = l.kind and e.step = l.step
     left join trajectories t on t.run_id = e.run_id and t.id = e.trajectory_id
     where e.run_id = $1 order by e.trajectory_id limit ${REPORT_EPISODES}`,
    [runId],
  );
  if (eps.length === 0) return [];
  const turns = await queryObjects<any>(
    database,
    `select trajectory_id, role, text, tool_name, arguments, error, reward, latency_ms from episode_turns
     where run_id = $1 and trajectory_id = any($2::text[]) order by trajectory_id, turn_index`,
    [runId, eps.map((e) => e.trajectory_id)],
  );
  return eps.map((e) => ({
    trajectoryId: e.trajectory_id,
    step: e.step,
    kind: e.kind,
    prompt: e.prompt_text ?? null,
    outcome: e.failure !== null ? 'failed' : e.done ? 'done' : 'cut',
    failure: e.failure,
    reward: e.reward,
    assistantTurns: e.assistant_turns,
    turns: turns
      .filter((t) => t.trajectory_id === e.trajectory_id)
      .map((t) => ({
        role: t.role,
        text: t.text,
        toolName: t.tool_name,
        arguments: t.arguments,
        error: t.error,
        reward: t.reward,
        latencyMs: t.latency_ms,
      })),
  }));
}

/** An episode as a conversation table: role, text (tool name and arguments for tool turns), per-turn reward. */
export function renderEpisode(e: ReportEpisode): string {
  const head =
    `<p class="mono">${escapeXml(e.trajectoryId)}</p>` +
    `<p>${escapeXml(`${e.kind} step ${e.step}: ${e.assistantTurns} assistant turns, ${e.outcome}${e.failure ? ` (${e.failure})` : ''}, reward ${formatNumber(e.reward)}`)}</p>`;
  const rows = [
    ...(e.prompt === null ? [] : [['prompt', e.prompt, '', '', '']]),
    ...e.turns.map((t) => [
      t.role,
      t.text,
      t.toolName === null ? '' : `${t.toolName}${t.arguments === null ? '' : ` ${t.arguments}`}`,
      t.role === 'assistant' ? '' : formatNumber(t.reward),
      t.error ?? '',
    ]),
  ];
  return head + table(['role', 'text', 'tool', 'reward', 'error'], rows, 'episode mono');
}

function series(data: ReportData, name: string, label = name, dashed = false): PlotSeries[] {
  const pts = data.metrics.get(name);
  return pts && pts.length ? [{ name: label, points: pts, dashed }] : [];
}

/** The series of each plot (empty when nothing was logged: the plot then says "no data logged"). */
export function plotSeries(data: ReportData, id: ReportPlotId): PlotSeries[] {
  switch (id) {
    case 'reward':
      return [
        ...series(data, 'reward/mean'),
        ...series(data, 'reward/max', 'reward/max', true),
        ...series(data, 'reward/min', 'reward/min', true),
      ];
    case 'val_accuracy':
      return [...series(data, 'val/accuracy'), ...series(data, 'val/reward_score', 'val/reward_score', true)];
    case 'kl':
      return [...series(data, 'kl/mean'), ...series(data, 'actor/approx_kl'), ...series(data, 'actor/ppo_kl')];
    case 'entropy':
      return series(data, 'actor/entropy');
    case 'response_length': {
      const out = series(data, 'response_length/mean');
      const rl = data.responseLength;
      if (rl.length) {
        if (!out.length) out.push({ name: 'mean (trajectories)', points: rl.map((r) => [r.step, r.mean]) });
        out.push({ name: 'p50', points: rl.map((r) => [r.step, r.p50]), dashed: true });
        out.push({ name: 'p90', points: rl.map((r) => [r.step, r.p90]), dashed: true });
        out.push({ name: 'max', points: rl.map((r) => [r.step, r.max]), dashed: true });
      }
      return out;
    }
    case 'clipfrac':
      return series(data, 'actor/clipfrac');
    case 'step_time': {
      const stages = [...data.metrics.keys()]
        .filter((n) => n.startsWith(STEP_TIME_PREFIX))
        .map((n) => n.slice(STEP_TIME_PREFIX.length))
        .sort(stageOrder);
      if (stages.length) return stages.map((s) => ({ name: s, points: data.metrics.get(STEP_TIME_PREFIX + s)! }));
      return stageBusyTime(data.metrics);
    }
  }
}

/**
 * Without perf/step_time_s/<stage>, a stage's time at a step is the sum of its timing phases
 * (timing/<stage>/<phase>_s, e.g. load + generate), waiting for input (wait_s) excluded.
 */
export function stageBusyTime(metrics: ReadonlyMap<string, Points>): PlotSeries[] {
  const byStage = new Map<string, Map<number, number>>();
  for (const [name, pts] of metrics) {
    const m = /^timing\/([^/]+)\/([^/]+)_s$/.exec(name);
    if (!m || m[2] === 'wait') continue;
    let steps = byStage.get(m[1]);
    if (!steps) byStage.set(m[1], (steps = new Map()));
    for (const [step, v] of pts) steps.set(step, (steps.get(step) ?? 0) + v);
  }
  return [...byStage]
    .sort((a, b) => stageOrder(a[0], b[0]))
    .map(([stage, steps]) => ({
      name: `${stage} (sum of timing phases)`,
      points: [...steps].sort((a, b) => a[0] - b[0]),
    }));
}

const num = (v: number | null | undefined, digits?: number) =>
  v === null || v === undefined
    ? '—'
    : digits !== undefined && Number.isFinite(v) && !Number.isInteger(v)
      ? v.toFixed(digits)
      : formatNumber(v);

function table(header: string[] | null, rows: string[][], cls = ''): string {
  const th = header ? `<thead><tr>${header.map((h) => `<th>${escapeXml(h)}</th>`).join('')}</tr></thead>` : '';
  const tr = rows.map((r) => `<tr>${r.map((c) => `<td>${escapeXml(c)}</td>`).join('')}</tr>`).join('\n');
  return `<table${cls ? ` class="${cls}"` : ''}>${th}<tbody>\n${tr}\n</tbody></table>`;
}

function last(pts: Points | undefined): [number, number] | undefined {
  return pts && pts.length ? pts[pts.length - 1] : undefined;
}

/** The summary rows: what a reader wants first. */
export function summaryRows(data: ReportData): Array<[string, string]> {
  const r = data.run;
  const fr = last(data.metrics.get('reward/mean'));
  const fv = last(data.metrics.get('val/accuracy'));
  const lastCk = data.checkpoints[data.checkpoints.length - 1];
  return [
    ['run', r.runId ?? '—'],
    ['project / experiment', `${r.project ?? '—'} / ${r.experiment ?? '—'}`],
    ['status', r.status],
    ...(r.error ? [['error', r.error] as [string, string]] : []),
    ...(r.parentRunId ? [['parent run (replay/fork)', r.parentRunId] as [string, string]] : []),
    ['steps (last step)', `${num(r.steps)} (${num(r.lastStep)})`],
    ['final reward (mean)', fr ? `${num(fr[1], 4)} at step ${fr[0]}` : '—'],
    [
      'best validation accuracy',
      r.bestValAccuracy !== null ? `${num(r.bestValAccuracy, 4)} at step ${r.bestValStep}` : '—',
    ],
    ['final validation accuracy', fv ? `${num(fv[1], 4)} at step ${fv[0]}` : '—'],
    [
      'checkpoints',
      lastCk
        ? `${data.checkpoints.length} (latest: step ${lastCk.step}, policy v${lastCk.policyVersion}, sha256 ${lastCk.sha256.slice(0, 12)}…)`
        : '0',
    ],
    ['trajectories', num(r.trajectories)],
    [
      'staleness (mean / max)',
      data.staleness.mean === null ? '—' : `${num(data.staleness.mean, 3)} / ${num(data.staleness.max)}`,
    ],
    ['filtered groups', String(data.filtered.reduce((s, f) => s + f.groups, 0))],
    ['reward failures', String(data.rewardFailuresTotal)],
    ['dead letters', String(data.deadLettersTotal)],
    ['created / updated (UTC)', `${r.createdAt ?? '—'} / ${r.updatedAt ?? '—'}`],
  ];
}

const STYLE = `
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #222; background: #fafafa; }
h1 { font-size: 22px; margin: 0 0 4px 0; } h2 { font-size: 17px; margin: 28px 0 8px 0; }
.sub { color: #666; font-size: 13px; margin-bottom: 16px; }
table { border-collapse: collapse; font-size: 13px; background: #fff; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
table.summary td:first-child { font-weight: 600; white-space: nowrap; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; border: 1px solid #ddd; background: #fff; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
footer { margin-top: 32px; color: #888; font-size: 12px; }
`;

/** The whole HTML document. `generatedAt` is printed in the footer (pass it for reproducible output). */
export function renderReport(data: ReportData, opts: { generatedAt?: Date } = {}): string {
  const r = data.run;
  const plots = REPORT_PLOTS.map(
    (p) =>
      `<figure id="fig-${p.id}">${renderLinePlot({ id: p.id, title: p.title, xLabel: 'step', yLabel: p.yLabel, series: plotSeries(data, p.id) })}</figure>`,
  );
  const o: string[] = [];
  o.push(
    '<!DOCTYPE html>',
    '<html lang="en">',
    '<head>',
    '<meta charset="utf-8">',
    `<title>rlstream report — ${escapeXml(r.runId ?? '')}</title>`,
    `<style>${STYLE}</style>`,
    '</head>',
    '<body>',
  );
  o.push(`<h1>rlstream report: ${escapeXml(r.runId ?? '')}</h1>`);
  o.push(`<div class="sub">${escapeXml(`${r.project ?? ''} / ${r.experiment ?? ''} — status ${r.status}`)}</div>`);
  o.push(
    '<h2>Summary</h2>',
    table(
      null,
      summaryRows(data).map(([k, v]) => [k, v]),
      'summary',
    ),
  );
  o.push('<h2>Plots</h2>', `<div class="plots">\n${plots.join('\n')}\n</div>`);
  if (data.valImages.length) {
    // shown at 3× with nearest-neighbour scaling, so small images stay legible
    const figs = data.valImages.map(
      (v) =>
        `<figure class="val-image"><img src="data:image/png;base64,${v.pngBase64}" width="${3 * v.width}" height="${3 * v.height}" alt="validation prompt ${v.promptIndex}" style="image-rendering: pixelated">` +
        `<figcaption>prompt ${v.promptIndex}: answered <span class="mono">${escapeXml(v.response)}</span>${v.groundTruth === null ? '' : `, expected <span class="mono">${escapeXml(v.groundTruth)}</span>`}, reward ${v.reward === null ? 'failed' : escapeXml(formatNumber(v.reward))}</figcaption></figure>`,
    );
    o.push(
      `<h2>Validation images (round ${data.valImages[0]!.step})</h2>`,
      `<div class="plots">\n${figs.join('\n')}\n</div>`,
    );
  }
  if (data.generated.length) {
    // one row per step: what the image policy drew, at 3× with nearest-neighbour scaling
    const rows = data.generated.map(
      (g) =>
        `<h3>step ${g.step}</h3><div class="plots">\n` +
        g.images
          .map(
            (v) =>
              `<figure class="val-image"><img src="data:image/png;base64,${v.pngBase64}" width="${3 * v.width}" height="${3 * v.height}" alt="generated for ${escapeXml(v.prompt)}" style="image-rendering: pixelated">` +
              `<figcaption><span class="mono">${escapeXml(v.prompt)}</span>, reward ${v.reward === null ? 'failed' : escapeXml(formatNumber(v.reward))}</figcaption></figure>`,
          )
          .join('\n') +
        '\n</div>',
    );
    o.push('<h2>Generated images</h2>', rows.join('\n'));
  }
  if (data.episodes.length) {
    const e0 = data.episodes[0]!;
    o.push(
      `<h2>Episodes (${escapeXml(e0.kind)} step ${e0.step}, first ${data.episodes.length})</h2>`,
      data.episodes.map(renderEpisode).join('\n'),
    );
  }
  o.push('<h2>Checkpoints</h2>');
  o.push(
    data.checkpoints.length
      ? table(
          ['step', 'policy version', 'sha256', 'path', 'created (UTC)', 'matches parent'],
          data.checkpoints.map((c) => [
            String(c.step),
            String(c.policyVersion),
            c.sha256,
            c.path,
            c.createdAt,
            c.matchesParent === null ? '—' : c.matchesParent ? 'yes' : 'NO',
          ]),
        )
      : '<p>No checkpoints recorded.</p>',
  );
  o.push('<h2>Filtered groups</h2>');
  o.push(
    data.filtered.length
      ? table(
          ['filter reason', 'groups'],
          data.filtered.map((f) => [f.reason, String(f.groups)]),
        )
      : '<p>No groups were filtered.</p>',
  );
  o.push('<h2>Reward failures</h2>');
  o.push(
    data.rewardFailures.length
      ? table(
          ['reason', 'count'],
          data.rewardFailures.map((f) => [f.reason, String(f.n)]),
        )
      : '<p>No reward failures.</p>',
  );
  o.push('<h2>Dead letters</h2>');
  o.push(
    data.deadLetters.length
      ? `${data.deadLettersTotal > data.deadLetters.length ? `<p>First ${data.deadLetters.length} of ${data.deadLettersTotal}.</p>` : ''}${table(
          ['stage', 'topic', 'partition', 'offset', 'reason', 'created (UTC)'],
          data.deadLetters.map((d) => [d.stage, d.topic, String(d.partition), String(d.offset), d.reason, d.createdAt]),
        )}`
      : '<p>No dead letters.</p>',
  );
  o.push(
    `<footer>Generated by rlstream report${opts.generatedAt ? ` at ${escapeXml(opts.generatedAt.toISOString())}` : ''}. Query the same data with <span class="mono">rlstream sql &lt;run&gt; "select * from v_step_metrics_wide"</span>.</footer>`,
  );
  o.push('</body>', '</html>', '');
  return o.join('\n');
}

/** Loads, renders and writes the report (atomically: temp file then rename). */
export async function writeReport(
  database: Database,
  runId: string,
  outPath: string,
  opts: { generatedAt?: Date } = {},
): Promise<{ path: string; plots: Array<{ id: ReportPlotId; series: number }> }> {
  const data = await loadReportData(database, runId);
  const html = renderReport(data, opts);
  mkdirSync(dirname(outPath), { recursive: true });
  const tmp = `${outPath}.${process.pid}.tmp`;
  writeFileSync(tmp, html);
  renameSync(tmp, outPath);
  return { path: outPath, plots: REPORT_PLOTS.map((p) => ({ id: p.id, series: plotSeries(data, p.id).length })) };
}
