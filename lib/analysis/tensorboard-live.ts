/**
 * TensorBoard event files written while a run trains (`trainer.logger` includes `tensorboard`).
 *
 * Syncs when told a step settled (`rlstream train` calls `sync()` as it sees each update and
 * validation round go by, and does not poll), or polls once a second (a `serve`d controller has
 * no such signal); each sync reads the run's step_metrics and appends the scalars of every *settled* step to
 * `<run_dir>/tensorboard/<runEventFileName>` — the file `rlstream report --tensorboard` writes, so
 * the two never hold two copies of a scalar. A step's train metrics are settled once the update
 * stage (`rlstream sft`: the sft loop) has written that step (it is the last stage of a step; an earlier step the update never
 * wrote, because it was skipped, is settled by a later one); a validation round's `val/*` metrics
 * are written by the controller in one transaction, so they are settled as soon as they appear.
 *
 * Restart safety: opening rewrites the file from the store (settled steps only, atomically), so
 * what an earlier, interrupted process appended is replaced rather than duplicated; appends go on
 * from there. When the run completes, `finish(true)` replaces the file with the full export, so a
 * finished run's file is exactly what `rlstream report --tensorboard` writes.
 */
import { join } from 'node:path';
import { sql } from 'kysely';
import type { Db } from '../db/database.ts';
import { TensorBoardWriter, exportRunToTensorBoard, runCreatedSeconds, runEventFileName } from './tensorboard.ts';

/** Where a run's TensorBoard files go (the default of `rlstream report --tensorboard` too). */
export function tensorboardDir(runDir: string): string {
  return join(runDir, 'tensorboard');
}

interface Row {
  step: number;
  name: string;
  value: number;
  stage: string | null;
  wall: number;
}

export interface LiveTensorBoardOptions {
  /** How often the store is polled for new steps (default 1000 ms); null: never — the caller calls sync() when a step settles. */
  intervalMs?: number | null;
  /** Called with an error of a background poll (the poll is retried at the next interval). */
  onError?: (e: unknown) => void;
}

export class LiveTensorBoard {
  /** Train metrics of every step ≤ this are written (steps start at 0: validation before training). */
  private trainUpTo = -1;
  /** Steps whose validation metrics are written. */
  private readonly valSteps = new Set<number>();
  private writer: TensorBoardWriter | undefined;
  private chain: Promise<unknown> = Promise.resolve();
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  /** Scalars appended since opening (the opening rewrite included). */
  written = 0;

  private constructor(
    private readonly db: Db,
    private readonly runId: string,
    readonly dir: string,
    readonly path: string,
  ) {}

  /** Rewrites the run's event file from the store's settled steps and starts polling (needs the run's row). */
  static async open(db: Db, runId: string, dir: string, opts: LiveTensorBoardOptions = {}): Promise<LiveTensorBoard> {
    const created = await runCreatedSeconds(db, runId);
    const filename = runEventFileName(runId, created);
    const first = new TensorBoardWriter(dir, { filename, atomic: true, wallTime: created });
    const live = new LiveTensorBoard(db, runId, dir, first.path);
    try {
      await live.syncInto(first);
      first.close();
    } catch (e) {
      first.abort();
      throw e;
    }
    live.writer = new TensorBoardWriter(dir, { filename });
    if (opts.intervalMs === null) return live;
    const interval = opts.intervalMs ?? 1000;
    const tick = () => {
      live.timer = undefined;
      void live
        .sync()
        .catch((e: unknown) => opts.onError?.(e))
        .finally(() => {
          if (!live.closed) {
            live.timer = setTimeout(tick, interval);
            live.timer.unref();
          }
        });
    };
    live.timer = setTimeout(tick, interval);
    live.timer.unref();
    return live;
  }

  /** Appends the steps settled since the last sync; resolves with how many scalars were written. */
  sync(): Promise<number> {
    return this.serial(async () => (this.writer ? this.syncInto(this.writer) : 0));
  }

  /**
   * Stops polling. A completed run's file is replaced by the full export (every metric, final
   * values); otherwise the settled steps are appended and the file is closed.
   */
  async finish(completed: boolean): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    await this.serial(async () => {
      const w = this.writer;
      this.writer = undefined;
      if (!w) return;
      try {
        if (!completed) await this.syncInto(w);
      } finally {
        w.close();
      }
      if (completed) await exportRunToTensorBoard(this.db, this.runId, this.dir);
    });
  }

  private serial<T>(f: () => Promise<T>): Promise<T> {
    const next = this.chain.then(f, f);
    this.chain = next.catch(() => undefined);
    return next;
  }

  private async syncInto(w: TensorBoardWriter): Promise<number> {
    const floor = this.trainUpTo;
    const rows = (
      await sql<Row>`
      select step, name, value, stage, extract(epoch from created_at)::float8 as wall
      from step_metrics
      where run_id = ${this.runId} and (step > ${floor} or name like 'val/%')
      order by step, name`.execute(this.db)
    ).rows;
    let upTo = floor;
    for (const r of rows) {
      if (
        r.step > upTo &&
        !r.name.startsWith('val/') &&
        (r.stage ?? '').split(',').some((st) => st === 'update' || st === 'sft')
      )
        upTo = r.step;
    }
    const newVal = new Set<number>();
    let n = 0;
    for (const r of rows) {
      const isVal = r.name.startsWith('val/');
      if (isVal ? this.valSteps.has(r.step) : r.step <= floor || r.step > upTo) continue;
      w.scalar(r.name, r.step, r.value, r.wall);
      if (isVal) newVal.add(r.step);
      n++;
    }
    w.flush();
    this.trainUpTo = upTo;
    for (const s of newVal) this.valSteps.add(s);
    this.written += n;
    return n;
  }
}
