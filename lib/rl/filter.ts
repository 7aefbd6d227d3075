/**
 * Online (dynamic-sampling) group filtering, registry `online_filter`, and the controller that draws
 * more rollout batches until enough groups survive.
 *
 *  - easyr1 (EasyR1 ray_trainer._make_batch_data): keep a group iff
 *    filter_low < mean(reward_metrics[filter_key]) < filter_high (strict both sides).
 *  - dapo (DAPO, arXiv 2503.14476; verl recipe/dapo): keep a group iff its metric's std > 0, i.e. the
 *    values are not all equal; a single-response group is kept, as in the DAPO recipe
 *    (`std > 0 or len == 1`) — set keep_singletons: false to drop it.
 *
 * The controller (`offerBatch`, driven by `makeFilteredBatch`) accumulates kept groups over drawn
 * batches until `rollout_batch_size` groups are kept, then selects the first rollout_batch_size of
 * them; after `max_try_make_batch` draws (≤ 0 = unlimited) without enough groups it throws.
 */
import { ConfigError, RlError } from '../errors.ts';
import { Registry } from './registry.ts';
import { checkScalar, groupRows, type GroupLabel } from './tensor.ts';

export interface GroupFilterConfig {
  /** easyr1: exclusive lower bound of the group mean (default 0.01). */
  filter_low?: number;
  /** easyr1: exclusive upper bound of the group mean (default 0.99). */
  filter_high?: number;
  /** dapo: keep single-response groups (default true, as the DAPO recipe). */
  keep_singletons?: boolean;
}

/** Decides from one group's metric values whether the group is kept. */
export type GroupFilter = (values: Float64Array, cfg: GroupFilterConfig) => boolean;

const easyr1: GroupFilter = (values, cfg) => {
  const lo = cfg.filter_low ?? 0.01,
    hi = cfg.filter_high ?? 0.99;
  let s = 0;
  for (let i = 0; i < values.length; i++) s += values[i];
  const mean = s / values.length;
  return mean > lo && mean < hi;
};

const dapo: GroupFilter = (values, cfg) => {
  if (values.length === 1) return cfg.keep_singletons ?? true;
  for (let i = 1; i < values.length; i++) if (values[i] !== values[0]) return true;
  return false; // all equal: std = 0
};

/** Registry `online_filter` (filter semantics). */
export const onlineFilters = new Registry<GroupFilter>('online_filter', { easyr1, dapo });

export interface FilterGroupsResult {
  /** 1 for each row whose group is kept. */
  keep: Uint8Array;
  /** Kept rows in batch order. */
  kept_rows: number[];
  kept_groups: GroupLabel[];
  dropped_groups: GroupLabel[];
}

function checkFilterConfig(semantics: string, cfg: GroupFilterConfig): GroupFilter {
  const f = onlineFilters.get(semantics);
  if (semantics === 'easyr1') {
    const lo = checkScalar('filter_low', cfg.filter_low ?? 0.01);
    const hi = checkScalar('filter_high', cfg.filter_high ?? 0.99);
    if (!(lo < hi)) throw new ConfigError(`online filtering: filter_low (${lo}) must be < filter_high (${hi})`);
  }
  return f;
}

/**
 * Applies one filter semantics to a batch: `metric[i]` is the filter metric of row i (e.g.
 * reward_metrics["overall"] or "acc"), `index[i]` its group label.
 */
export function filterGroups(
  index: readonly GroupLabel[],
  metric: ArrayLike<number>,
  semantics: string,
  cfg: GroupFilterConfig = {},
): FilterGroupsResult {
  const filter = checkFilterConfig(semantics, cfg);
  const bs = index.length;
  if (metric.length !== bs)
    throw new ConfigError(`online filtering: the metric has ${metric.length} values for ${bs} responses`);
  for (let i = 0; i < bs; i++) {
    if (typeof metric[i] !== 'number' || !Number.isFinite(metric[i]))
      throw new ConfigError(
        `online filtering: metric value of response ${i} is ${metric[i]}; filter metrics must be finite numbers`,
      );
  }
  const { order, start, nGroups, labels, gid } = groupRows(index, bs, 'online filtering: index');
  const keptGroup = new Uint8Array(nGroups);
  const kept_groups: GroupLabel[] = [],
    dropped_groups: GroupLabel[] = [];
  for (let g = 0; g < nGroups; g++) {
    const vals = new Float64Array(start[g + 1] - start[g]);
    for (let j = start[g]; j < start[g + 1]; j++) vals[j - start[g]] = metric[order[j]];
    keptGroup[g] = filter(vals, cfg) ? 1 : 0;
    (keptGroup[g] ? kept_groups : dropped_groups).push(labels[g]);
  }
  const keep = new Uint8Array(bs);
  const kept_rows: number[] = [];
  for (let i = 0; i < bs; i++)
    if (keptGroup[gid[i]]) {
      keep[i] = 1;
      kept_rows.push(i);
    }
  return { keep, kept_rows, kept_groups, dropped_groups };
}

// ---- controller ------------------------------------------------------------------------------

export interface OnlineFilterConfig extends GroupFilterConfig {
  /** "easyr1" or "dapo". */
  semantics: string;
  /** Name of the per-response reward metric to filter on (EasyR1 filter_key, DAPO filter_groups.metric). */
  filter_key: string;
  /** Number of groups (prompts) the training step needs. */
  rollout_batch_size: number;
  /** Most batches to draw (EasyR1 max_try_make_batch, DAPO max_num_gen_batches); ≤ 0 = unlimited. */
  max_try_make_batch: number;
}

/** One drawn rollout batch: group labels and per-response reward metrics. */
export interface DrawnBatch {
  index: readonly GroupLabel[];
  reward_metrics: Readonly<Record<string, ArrayLike<number>>>;
}

/** The rows selected from one drawn batch. */
export interface BatchSelection {
  batch: number;
  rows: number[];
}

export interface FilterState {
  readonly tries: number;
  /** Kept groups so far, in draw order: (batch, rows). */
  readonly kept: readonly { batch: number; label: GroupLabel; rows: number[] }[];
  readonly dropped: number;
  readonly seen: number;
}

export interface FilterStep {
  state: FilterState;
  done: boolean;
  /** When done: the first rollout_batch_size kept groups, per batch. */
  selection?: BatchSelection[];
  metrics: {
    'filter/num_gen_batches': number;
    'filter/kept_groups': number;
    'filter/dropped_groups': number;
    'filter/kept_group_fraction': number;
  };
}

export function initialFilterState(): FilterState {
  return { tries: 0, kept: [], dropped: 0, seen: 0 };
}

function checkControllerConfig(cfg: OnlineFilterConfig): void {
  if (!Number.isInteger(cfg.rollout_batch_size) || cfg.rollout_batch_size < 1)
    throw new ConfigError(`rollout_batch_size must be a positive integer, got ${cfg.rollout_batch_size}`);
  if (!Number.isInteger(cfg.max_try_make_batch))
    throw new ConfigError(`max_try_make_batch must be an integer (≤ 0 = unlimited), got ${cfg.max_try_make_batch}`);
  if (typeof cfg.filter_key !== 'string' || cfg.filter_key === '')
    throw new ConfigError('online filtering needs filter_key (the reward metric to filter on)');
}

/**
 * Offers one more drawn batch to the filter: pure, returns the next state. Throws once
 * max_try_make_batch batches have been drawn without collecting rollout_batch_size groups.
 */
export function offerBatch(state: FilterState, batch: DrawnBatch, cfg: OnlineFilterConfig): FilterStep {
  checkControllerConfig(cfg);
  const values = batch.reward_metrics[cfg.filter_key];
  if (!values)
    throw new ConfigError(
      `online filtering: reward metric "${cfg.filter_key}" is missing — available: ${Object.keys(batch.reward_metrics).sort().join(', ') || '(none)'}`,
    );
  const res = filterGroups(batch.index, values, cfg.semantics, cfg);
  const batchNo = state.tries;
  const byLabel = new Map<GroupLabel, number[]>();
  for (const i of res.kept_rows) {
    const l = batch.index[i];
    const rows = byLabel.get(l);
    if (rows) rows.push(i);
    else byLabel.set(l, [i]);
  }
  const kept = [
    ...state.kept,
    ...res.kept_groups.map((label) => ({ batch: batchNo, label, rows: byLabel.get(label)! })),
  ];
  const next: FilterState = {
    tries: state.tries + 1,
    kept,
    dropped: state.dropped + res.dropped_groups.length,
    seen: state.seen + res.kept_groups.length + res.dropped_groups.length,
  };
  const metrics = {
    'filter/num_gen_batches': next.tries,
    'filter/kept_groups': next.kept.length,
    'filter/dropped_groups': next.dropped,
    'filter/kept_group_fraction': next.seen > 0 ? next.kept.length / next.seen : 0,
  };
  if (kept.length >= cfg.rollout_batch_size) {
    const selection: BatchSelection[] = [];
    for (const g of kept.slice(0, cfg.rollout_batch_size)) {
      const last = selection[selection.length - 1];
      if (last && last.batch === g.batch) last.rows.push(...g.rows);
      else selection.push({ batch: g.batch, rows: [...g.rows] });
    }
    for (const s of selection) s.rows.sort((a, b) => a - b);
    return { state: next, done: true, selection, metrics };
  }
  if (cfg.max_try_make_batch > 0 && next.tries >= cfg.max_try_make_batch) {
    const rule =
      cfg.semantics === 'easyr1'
        ? `${cfg.filter_low ?? 0.01} < mean(${cfg.filter_key}) < ${cfg.filter_high ?? 0.99}`
        : `std(${cfg.filter_key}) > 0`;
    throw new RlError(
      `online filtering (${cfg.semantics}: keep a group iff ${rule}) kept ${kept.length} of the ${cfg.rollout_batch_size} groups needed after ` +
        `${next.tries} generated batches (max_try_make_batch = ${cfg.max_try_make_batch}); ${next.dropped} groups were dropped. ` +
        'Most prompts are solved always or never: widen the filter range, raise max_try_make_batch (≤ 0 = unlimited) or change the dataset.',
      {
        retriable: false,
        code: 'ERR_FILTER_EXHAUSTED',
        details: { kept: kept.length, needed: cfg.rollout_batch_size, tries: next.tries, dropped: next.dropped },
      },
    );
  }
  return { state: next, done: false, metrics };
}

/**
 * Draws batches with `draw(attempt)` (the caller's rollout + reward step) until rollout_batch_size
 * groups pass the filter; returns the drawn batches and the selection to train on.
 */
export async function makeFilteredBatch<B extends DrawnBatch>(
  draw: (attempt: number) => B | Promise<B>,
  cfg: OnlineFilterConfig,
): Promise<{ batches: B[]; selection: BatchSelection[]; metrics: FilterStep['metrics'] }> {
  checkControllerConfig(cfg);
  onlineFilters.get(cfg.semantics);
  let state = initialFilterState();
  const batches: B[] = [];
  for (;;) {
    const b = await draw(state.tries);
    batches.push(b);
    const step = offerBatch(state, b, cfg);
    state = step.state;
    if (step.done) return { batches, selection: step.selection!, metrics: step.metrics };
  }
}
