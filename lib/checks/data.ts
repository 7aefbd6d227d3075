/**
 * `rlstream check data <config>`: what a run would make of its data, before the run. Per split:
 * rows read, used and left out (by reason, with file:line examples), prompt token lengths (after
 * the chat template, as the policy sees them) and ground-truth token lengths against
 * data.max_prompt_length / max_response_length as histograms, a few prompts rendered exactly as
 * the model sees them, and the run's reward function called on the ground truths (each must score
 * as correct) and on empty responses (which should not earn reward). Data are loaded by the same
 * code as a run (lib/pipeline/data.ts), with bad rows collected instead of stopping at the first.
 */
import type { Config } from '../config/index.ts';
import { loadRunData, type PromptRow } from '../pipeline/data.ts';
import { tokenizerFor } from '../pipeline/policy.ts';
import { parseExtraInfo } from '../reward-fns/index.ts';
import { openRewardProbe, type ProbeOutcome } from './reward-probe.ts';

export interface Histogram {
  limit: number;
  /** [from, to] inclusive token counts and how many fall there; the last bin is over the limit. */
  bins: Array<{ from: number; to: number | null; count: number }>;
  min: number;
  median: number;
  p95: number;
  max: number;
  over: number;
}

export interface RewardCheck {
  called: number;
  /** Ground truths that scored as correct (see `criterion`). */
  correct: number;
  criterion: string;
  /** Ground truths that did not: file:line, reward or failure, the answer. */
  wrong: Array<{ where: string; answer: string; got: string }>;
  emptyMean: number | null;
  /** Empty responses with a reward above 0. */
  emptyRewarded: number;
  emptyFailures: number;
}

export interface SplitReport {
  split: 'train' | 'val';
  read: number;
  used: number;
  leftOut: Array<{ reason: string; count: number; examples: string[] }>;
  prompt: Histogram | null;
  answer: Histogram | null;
  samples: Array<{ where: string; text: string; tokens: number }>;
  reward: RewardCheck | null;
}

export interface DataReport {
  source: string;
  tokenizer: string;
  chatTemplate: boolean;
  reward: string;
  splits: SplitReport[];
  /** Findings that would spoil a run: the command exits 1 when there is any. */
  problems: string[];
  /** Findings worth a look. */
  warnings: string[];
}

export interface DataCheckOptions {
  /** Prompts rendered per split (default 2). */
  samples?: number;
  /** Rows per split whose ground truth the reward function is called on (default 256). */
  rewardRows?: number;
  /** How a ground truth is written as a response: `{answer}` is replaced (default `{answer}`). */
  asResponse?: string;
  warn?: (m: string) => void;
  stderr?: (line: string) => void;
}

export function histogram(values: readonly number[], limit: number, nbins = 8): Histogram | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const q = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
  const width = Math.max(1, Math.ceil(limit / nbins));
  const bins: Histogram['bins'] = [];
  for (let from = 0; from <= limit; from += width) bins.push({ from, to: Math.min(limit, from + width - 1), count: 0 });
  bins.push({ from: limit + 1, to: null, count: 0 });
  for (const v of values) {
    const i = v > limit ? bins.length - 1 : Math.min(bins.length - 2, Math.floor(v / width));
    bins[i]!.count++;
  }
  return {
    limit,
    bins,
    min: sorted[0]!,
    median: q(0.5),
    p95: q(0.95),
    max: sorted.at(-1)!,
    over: bins.at(-1)!.count,
  };
}

/** Groups reasons that differ only in their numbers (token counts, line numbers). */
function groupLeftOut(items: Array<{ where: string; reason: string }>): SplitReport['leftOut'] {
  const groups = new Map<string, { reason: string; count: number; examples: string[] }>();
  for (const it of items) {
    const key = it.reason.replace(/\d+/g, 'N');
    const g = groups.get(key) ?? { reason: it.reason, count: 0, examples: [] };
    g.count++;
    if (g.examples.length < 3) g.examples.push(it.where);
    groups.set(key, g);
  }
  return [...groups.values()].sort((a, b) => b.count - a.count);
}

const ACCURACY_KEYS = ['accuracy', 'acc', 'correct'] as const;

/** Correct: an accuracy-like metric (accuracy, acc, correct) of 1 when the function reports one, else a reward above 0. */
function isCorrect(o: ProbeOutcome): boolean {
  if (!o.ok) return false;
  for (const k of ACCURACY_KEYS) if (typeof o.metrics[k] === 'number') return o.metrics[k] === 1;
  return o.reward > 0;
}

function criterionOf(outs: ProbeOutcome[]): string {
  for (const o of outs)
    if (o.ok) for (const k of ACCURACY_KEYS) if (typeof o.metrics[k] === 'number') return `its "${k}" metric is 1`;
  return 'its reward is above 0';
}

export async function checkData(cfg: Config, opts: DataCheckOptions = {}): Promise<DataReport> {
  const tok = tokenizerFor(cfg);
  // every bad row collected (a run with on_bad_row = stop stops at the first); overlong prompts kept apart with their length
  const loose = structuredClone(cfg);
  loose.data.on_bad_row = 'skip';
  loose.data.filter_overlong_prompts = true;
  const data = await loadRunData(loose, tok);
  const problems: string[] = [];
  const warnings: string[] = [];
  const d = cfg.data;
  const probe = await openRewardProbe(cfg, { warn: opts.warn, stderr: opts.stderr });
  const template = opts.asResponse ?? '{answer}';
  const splits: SplitReport[] = [];
  try {
    for (const split of ['train', 'val'] as const) {
      const rows: PromptRow[] = data[split];
      const { bad, overlong } = data.leftOut[split];
      const read = rows.length + bad.length + overlong.length;
      if (read === 0) continue;
      const overlongWhy = d.filter_overlong_prompts
        ? `prompt longer than data.max_prompt_length = ${d.max_prompt_length} tokens (dropped: data.filter_overlong_prompts)`
        : `prompt longer than data.max_prompt_length = ${d.max_prompt_length} tokens (a bad row: data.filter_overlong_prompts is false)`;
      const leftOut = groupLeftOut([...bad, ...overlong.map((o) => ({ where: o.where, reason: overlongWhy }))]);
      const stopsAt =
        d.on_bad_row === 'stop' && (bad.length > 0 || (overlong.length > 0 && !d.filter_overlong_prompts));
      if (stopsAt)
        problems.push(
          `${split}: ${bad.length + (d.filter_overlong_prompts ? 0 : overlong.length)} bad rows; a run stops at the first (data.on_bad_row = stop): fix them or set data.on_bad_row=skip`,
        );
      else if (leftOut.length)
        warnings.push(`${split}: ${read - rows.length} of ${read} rows are left out (listed above)`);
      const answerTokens = rows.map((r) => tok.encode(r.answer, { addSpecialTokens: false }).length);
      const answer = histogram(answerTokens, d.max_response_length);
      if (answer && answer.over > 0)
        problems.push(
          `${split}: ${answer.over} ground truths are longer than data.max_response_length = ${d.max_response_length} tokens (longest ${answer.max}): a response that long is cut off, so those answers cannot be given`,
        );
      const report: SplitReport = {
        split,
        read,
        used: rows.length,
        leftOut,
        prompt: histogram(
          [...rows.map((r) => r.promptIds.length), ...overlong.map((o) => o.tokens)],
          d.max_prompt_length,
        ),
        answer,
        samples: rows
          .slice(0, opts.samples ?? 2)
          .map((r) => ({ where: r.source, text: r.prompt, tokens: r.promptIds.length })),
        reward: null,
      };
      if (!('skipped' in probe)) {
        const chosen = rows.slice(0, opts.rewardRows ?? 256);
        const input = (r: PromptRow, response: string) => ({
          prompt: r.prompt,
          response,
          ground_truth: r.answer,
          data_source: r.dataSource ?? data.dataSource,
          extra_info: parseExtraInfo(r.extraInfo),
          images: r.images.map((im) => im.png),
        });
        const truths = await probe.score(chosen.map((r) => input(r, template.replaceAll('{answer}', r.answer))));
        const empty = await probe.score(chosen.map((r) => input(r, '')));
        const wrong = chosen
          .map((r, i) => ({ r, o: truths[i]! }))
          .filter(({ o }) => !isCorrect(o))
          .map(({ r, o }) => ({
            where: r.source,
            answer: r.answer,
            got: o.ok
              ? `reward ${o.reward}${Object.keys(o.metrics).length ? ` ${JSON.stringify(o.metrics)}` : ''}`
              : o.reason,
          }));
        const emptyOk = empty.filter((o): o is Extract<ProbeOutcome, { ok: true }> => o.ok);
        report.reward = {
          called: chosen.length,
          correct: chosen.length - wrong.length,
          criterion: criterionOf(truths),
          wrong,
          emptyMean: emptyOk.length ? emptyOk.reduce((a, o) => a + o.reward, 0) / emptyOk.length : null,
          emptyRewarded: emptyOk.filter((o) => o.reward > 0).length,
          emptyFailures: empty.length - emptyOk.length,
        };
        if (wrong.length > 0)
          problems.push(
            `${split}: the reward function does NOT score ${wrong.length} of ${chosen.length} ground truths as correct (first: ${wrong[0]!.where}: answer ${JSON.stringify(wrong[0]!.answer)} → ${wrong[0]!.got})${template === '{answer}' ? '; if the reward expects a format (e.g. \\boxed{…}), pass it with --as-response' : ''}`,
          );
        if (report.reward.emptyRewarded > 0)
          warnings.push(
            `${split}: ${report.reward.emptyRewarded} of ${chosen.length} empty responses earn a reward above 0 (mean ${report.reward.emptyMean}): the policy can be paid for saying nothing`,
          );
        if (report.reward.emptyFailures > 0)
          warnings.push(
            `${split}: the reward function fails on ${report.reward.emptyFailures} empty responses (a run records each as a reward failure)`,
          );
      }
      splits.push(report);
    }
  } finally {
    if (!('skipped' in probe)) await probe.close();
  }
  if ('skipped' in probe) warnings.push(`the reward is not called: ${probe.skipped}`);
  return {
    source: data.dataSource,
    tokenizer: cfg.actor.model.path ?? cfg.actor.model.tokenizer,
    chatTemplate: d.apply_chat_template && tok.chatTemplate !== null,
    reward: 'skipped' in probe ? `not called (${probe.skipped})` : probe.name,
    splits,
    problems,
    warnings,
  };
}

function formatHistogram(title: string, h: Histogram | null, unit: string): string[] {
  if (!h) return [`  ${title}: none`];
  const peak = Math.max(1, ...h.bins.map((b) => b.count));
  const label = (b: Histogram['bins'][number]) => (b.to === null ? `> ${h.limit}` : `${b.from}–${b.to}`);
  const w = Math.max(...h.bins.map((b) => label(b).length));
  return [
    `  ${title} (${unit}; limit ${h.limit}): min ${h.min}, median ${h.median}, p95 ${h.p95}, max ${h.max}${h.over ? `, ${h.over} OVER the limit` : ''}`,
    ...h.bins.map(
      (b) =>
        `    ${label(b).padStart(w)} │${'█'.repeat(Math.round((b.count / peak) * 30))}${b.count ? ` ${b.count}` : ''}`,
    ),
  ];
}

export function formatDataReport(r: DataReport): string {
  const out: string[] = [
    `data: ${r.source}; tokenizer ${r.tokenizer}${r.chatTemplate ? ' with its chat template' : ' (no chat template)'}; reward ${r.reward}`,
  ];
  for (const s of r.splits) {
    out.push('', `${s.split}: ${s.read} rows read, ${s.used} used, ${s.read - s.used} left out`);
    for (const l of s.leftOut) out.push(`  left out ×${l.count}: ${l.reason} (e.g. ${l.examples.join(', ')})`);
    out.push(...formatHistogram('prompt tokens, after the chat template', s.prompt, 'tokens'));
    out.push(...formatHistogram('ground-truth tokens (the shortest correct response)', s.answer, 'tokens'));
    for (const p of s.samples) {
      out.push(`  prompt as the model sees it (${p.where}, ${p.tokens} tokens):`);
      for (const line of p.text.split('\n')) out.push(`    │${line}`);
    }
    if (s.reward) {
      const w = s.reward;
      out.push(
        `  reward on the ground truths: ${w.correct} of ${w.called} scored as correct (correct: ${w.criterion})${w.correct === w.called ? '' : ' — NOT ALL'}`,
      );
      for (const x of w.wrong.slice(0, 3)) out.push(`    ${x.where}: answer ${JSON.stringify(x.answer)} → ${x.got}`);
      out.push(
        `  reward on empty responses: ${w.emptyMean === null ? 'none scored' : `mean ${w.emptyMean}`}${w.emptyRewarded ? `, ${w.emptyRewarded} above 0` : ''}${w.emptyFailures ? `, ${w.emptyFailures} failed` : ''}`,
      );
    }
  }
  out.push('');
  for (const w of r.warnings) out.push(`warning: ${w}`);
  for (const p of r.problems) out.push(`PROBLEM: ${p}`);
  out.push(r.problems.length ? `check data: ${r.problems.length} problem(s) found` : 'check data: ok');
  return `${out.join('\n')}\n`;
}
