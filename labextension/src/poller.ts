/**
 * What the status bar and the panel show, fetched together on one schedule: every 3 s, every
 * second while one of the user's jobs is queued or running (so that a `%%train` cell's job is
 * seen ending as the cell does), and at once when the browser tab is shown again. While the
 * pool cannot be reached, `error` says so in one sentence and the poll keeps trying, backing
 * off to at most 30 s between tries.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { GpushareAPI, GpushareError } from './api';
import { BuildSlice, Job, Quota, sentence, sortJobs } from './model';

const IDLE_MS = 3000;
const LIVE_MS = 1000;

export class GpushareModel {
  constructor(readonly api: GpushareAPI) {
    this._poll = new Poll({
      factory: () => this._fetch(),
      frequency: { interval: IDLE_MS, backoff: true, max: 30000 },
      name: 'jupyter-gpushare',
      standby: 'when-hidden'
    });
    document.addEventListener('visibilitychange', this._onVisible);
  }

  quota: Quota | null = null;
  jobs: Job[] = [];
  slice: BuildSlice | null = null;
  error: string | null = null;
  /** When the pool last answered, in seconds since the epoch. */
  updated: number | null = null;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Fetch now rather than at the next tick (after the user did something). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  job(id: string): Job | undefined {
    return this.jobs.find(j => j.id === id);
  }

  dispose(): void {
    document.removeEventListener('visibilitychange', this._onVisible);
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _fetch(): Promise<void> {
    // The slice belongs to this server, not to the pool: its absence is no pool error.
    const slice = this.api.slice().catch(() => null);
    try {
      const [quota, jobs] = await Promise.all([this.api.quota(), this.api.jobs()]);
      this.quota = quota;
      this.jobs = sortJobs(jobs);
      const live = jobs.some(j => j.state === 'pending' || j.state === 'running');
      this._poll.frequency = { interval: live ? LIVE_MS : IDLE_MS, backoff: true, max: 30000 };
      this.error = null;
      this.updated = Date.now() / 1000;
    } catch (error) {
      const unreachable = error instanceof GpushareError && error.unreachable;
      this.error = sentence((error as Error).message) + (unreachable ? ' Retrying.' : '');
      this.slice = await slice;
      this._changed.emit();
      throw error; // the poll backs off
    }
    this.slice = await slice;
    this._changed.emit();
  }

  // Back in the tab: what changed meanwhile at once, not a poll later.
  private _onVisible = (): void => {
    if (document.visibilityState === 'visible') {
      void this.refresh();
    }
  };

  private _poll: Poll;
  private _changed = new Signal<this, void>(this);
}
