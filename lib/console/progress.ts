/**
 * Console progress for a training run: on a TTY a one-line bar redrawn in place
 * (steps, reward, val accuracy, ETA) with the log lines printed above it (ConsoleSink);
 * otherwise nothing here — the JSON log lines carry the same metrics, and they are never
 * dropped. The summary table at the end is printed in both cases, on its own lines.
 */
import { writeSync } from 'node:fs';
export interface ProgressState {
  step: number;
  totalSteps: number;
  reward?: number;
  /** `rlstream sft`: the step's training loss. */
  loss?: number;
  valAccuracy?: number;
  stepTimeS?: number;
  /** What the run is doing before its first step (opening the store, loading the model): shown until step 1. */
  phase?: string;
}

export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return '--:--';
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600),
    m = Math.floor((s % 3600) / 60),
    sec = s % 60;
  return h > 0
    ? `${h}:${String(m).padStart(2, '0')}:${String(sec).padStart(2, '0')}`
    : `${String(m).padStart(2, '0')}:${String(sec).padStart(2, '0')}`;
}

/** One progress line (without the carriage return), `width` columns for the bar. */
export function renderProgress(p: ProgressState, elapsedS: number, width = 24): string {
  const frac = p.totalSteps > 0 ? Math.min(1, p.step / p.totalSteps) : 0;
  const filled = Math.round(frac * width);
  const bar = '█'.repeat(filled) + '░'.repeat(width - filled);
  const eta = p.step > 0 ? (elapsedS / p.step) * (p.totalSteps - p.step) : NaN;
  const parts = [`step ${p.step}/${p.totalSteps}`, bar];
  if (p.reward !== undefined) parts.push(`reward ${p.reward.toFixed(3)}`);
  if (p.loss !== undefined) parts.push(`loss ${p.loss.toFixed(3)}`);
  if (p.valAccuracy !== undefined) parts.push(`val acc ${p.valAccuracy.toFixed(3)}`);
  parts.push(`elapsed ${formatDuration(elapsedS)}`);
  if (p.phase && p.step === 0) parts.push(p.phase);
  else parts.push(`eta ${formatDuration(eta)}`);
  return parts.join('  ');
}

/** Where the bar is drawn: a TTY stream (tests pass a collector). */
export interface BarStream {
  isTTY?: boolean;
  write(text: string): unknown;
}

export class ProgressBar {
  private readonly start: number;
  private state: ProgressState = { step: 0, totalSteps: 0 };
  private readonly enabled: boolean;
  /** The bar is on screen (its line holds no newline yet). */
  private drawn = false;
  private finished = false;
  constructor(
    private readonly stream: BarStream = process.stderr,
    now: () => number = () => performance.now(),
  ) {
    this.now = now;
    this.start = now();
    this.enabled = stream.isTTY === true;
  }
  private readonly now: () => number;
  update(patch: Partial<ProgressState>): void {
    this.state = { ...this.state, ...patch };
    if (!this.enabled || this.finished || this.state.totalSteps <= 0) return;
    const line = renderProgress(this.state, (this.now() - this.start) / 1000);
    this.stream.write(`\r\x1b[2K${line}`);
    this.drawn = true;
  }
  /** Clears the bar's line so a log line can be printed there, then redraws the bar below it. */
  interrupt(fn: () => void): void {
    if (this.enabled && this.drawn) {
      this.stream.write('\r\x1b[2K');
      this.drawn = false;
    }
    fn();
    if (this.enabled && !this.finished && this.state.totalSteps > 0) this.update({});
  }
  /** Leaves the last bar on its own line (what follows starts on a new line); no redraw after. */
  finish(): void {
    if (this.enabled && this.drawn) this.stream.write('\n');
    this.drawn = false;
    this.finished = true;
  }
}

/**
 * The logger's destination for `rlstream train`: each line goes to stderr synchronously (never
 * dropped), on a TTY above the progress bar. `mute()` drops everything from then on — after
 * Ctrl-C, so that nothing the stopping stages log appears after the stop message.
 */
export class ConsoleSink {
  private muted = false;
  constructor(
    private readonly bar: ProgressBar | null,
    private readonly out: (text: string) => void = (t) => {
      writeSync(2, t);
    },
  ) {}
  write(line: string): void {
    if (this.muted) return;
    if (this.bar) this.bar.interrupt(() => this.out(line));
    else this.out(line);
  }
  mute(): void {
    this.muted = true;
  }
}

/** A plain text table: first row is the header. Numbers are right-aligned. */
export function formatTable(rows: Array<Array<string | number>>): string {
  if (rows.length === 0) return '';
  const cells = rows.map((r) => r.map((c) => (typeof c === 'number' ? formatNumber(c) : c)));
  const widths = cells[0].map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  const numeric = rows[0].map((_, i) => rows.slice(1).every((r) => typeof r[i] === 'number'));
  const line = (r: string[]) =>
    r
      .map((c, i) => (numeric[i] ? c.padStart(widths[i]) : c.padEnd(widths[i])))
      .join('  ')
      .trimEnd();
  return [line(cells[0]), widths.map((w) => '-'.repeat(w)).join('  '), ...cells.slice(1).map(line)].join('\n');
}

export function formatNumber(v: number): string {
  if (!Number.isFinite(v)) return String(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e9) return String(v);
  const a = Math.abs(v);
  if (a >= 1e4 || (a > 0 && a < 1e-3)) return v.toExponential(3);
  return v.toFixed(4);
}
