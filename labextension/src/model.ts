/**
 * What the panel and the status bar show, worked out from the pool's JSON: pure functions,
 * no DOM and no JupyterLab imports, so that they are unit tested under plain Node.
 *
 * GPU amounts arrive from the pool in GPUs (the pool counts milli-GPUs inside and divides by
 * 1000), so they are compared in milli-GPUs here too, never as floats. Times and durations are
 * written by format.ts.
 */

import { ago, clockTime, duration } from './format';

export type JobState = 'pending' | 'running' | 'succeeded' | 'failed' | 'cancelled';

/** A job as the pool's `api/jobs` answers it (pool/web/openapi.py, `Job`). */
export interface Job {
  id: string;
  name: string;
  user: string;
  project: string;
  gpus: number;
  priority: number;
  state: JobState;
  attempt: number;
  queue_position: number | null;
  reason: string;
  submitted: number;
  started: number | null;
  finished: number | null;
  exit_code: number | null;
  preempting?: boolean;
  /** Node name -> GPUs, once placed; a node named `<build node>/lent` is build GPUs lent to the train pool. */
  placement?: Record<string, number> | null;
  /** While running: its GPU use as the pool reads it. */
  usage?: Usage | null;
  /** One rank per GPU instead of one per node. */
  per_gpu?: boolean;
  /** How many ranks (each with its own log) the current attempt has; null until placed. */
  ranks?: number | null;
}

/**
 * A running job's or a slice's GPU use as the pool reads it (pool/web/openapi.py, `usage`): SM
 * utilization of what it holds (0–1), memory, how long it has stayed idle, and the last hour
 * minute by minute (`[minute start, SM or null, memory peak]`).
 */
export interface Usage {
  sm_now: number | null;
  memory_now_bytes: number | null;
  sm_last_hour: number | null;
  memory_peak_last_hour_bytes?: number | null;
  idle_for_s: number | null;
  idle?: boolean;
  at?: number;
  minutes?: [number, number | null, number][];
}

/** The pool's warning that this server will be stopped for being idle (pool/web/openapi.py, `cull`). */
export interface Cull {
  warned_at: number;
  cull_at: number;
  reason: string;
}

/** A project as `api/quota` answers it (pool/web/openapi.py, `Project`). */
export interface Project {
  name: string;
  quota: number;
  limit: number | null;
  /** Every GPU its jobs hold, lent build GPUs too. */
  in_use: number;
  borrowed: number;
  /** GPUs its jobs hold on build GPUs lent to the train pool (part of borrowed). */
  lent?: number;
  deserved: number;
  pending: number;
  /** The department the project belongs to, null for none. */
  department?: string | null;
}

/** A department over projects as `api/quota` answers it (pool/web/openapi.py, `Department`). */
export interface Department {
  name: string;
  quota: number;
  limit: number | null;
  projects: string[];
  in_use: number;
  borrowed: number;
  lent?: number;
  deserved: number;
}

/** `api/quota`: the user's projects, their departments and the user's job counts by state. */
export interface Quota {
  user: string;
  admin: boolean;
  projects: Project[];
  departments?: Department[];
  jobs: Partial<Record<JobState, number>>;
}

/**
 * This server's build slice, from the server extension's `slice` route: the fraction of one
 * GPU, whether the slice watchdog last saw the server use more GPU memory than that, and the
 * pool's record of it: its GPU use and, while it is warned, when it will be culled.
 */
export interface BuildSlice {
  gpus: number;
  over: boolean;
  message: string;
  usage: Usage | null;
  cull: Cull | null;
}

/**
 * The `slice` route's answer (`{slice: {gpus, ...} | null, watchdog: {over, message} | null,
 * pool: {usage, cull} | null}`).
 */
export function buildSlice(body: any): BuildSlice | null {
  const slice = body?.slice;
  if (!slice || typeof slice.gpus !== 'number') {
    return null;
  }
  const watchdog = body.watchdog ?? {};
  const pool = body.pool ?? {};
  const cull = pool.cull && typeof pool.cull.cull_at === 'number' ? (pool.cull as Cull) : null;
  return {
    gpus: slice.gpus,
    over: watchdog.over === true,
    message: String(watchdog.message ?? ''),
    usage: pool.usage ?? null,
    cull
  };
}

// -- GPU use, in the words `gpushare jobs` and %gpushare print (jupyter_gpushare/usage_text.py) --

const GiB = 2 ** 30;
const MiB = 2 ** 20;
/** Shorter idle spells are not worth a flag. */
export const SHOW_IDLE_AFTER_S = 60;

/** 0.934 → "93%"; null (not measurable) → "-". */
export function percent(ratio: number | null | undefined): string {
  return ratio === null || ratio === undefined ? '-' : `${Math.round(ratio * 100)}%`;
}

/** Bytes as "11 GiB", "1.5 GiB", "300 MiB"; null → "-". */
export function size(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) {
    return '-';
  }
  if (bytes >= 10 * GiB) {
    return `${Math.round(bytes / GiB)} GiB`;
  }
  if (bytes >= GiB) {
    return `${(bytes / GiB).toFixed(1)} GiB`;
  }
  return `${Math.round(bytes / MiB)} MiB`;
}

/** "idle 25m 10s", "idle 3h 05m"; empty when not idle or idle less than a minute. */
export function idleText(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || seconds < SHOW_IDLE_AFTER_S) {
    return '';
  }
  return `idle ${duration(seconds)}`;
}

/** "SM 93% (1h 88%), 11 GiB": SM utilization now and over the last hour, and memory now. */
export function usageText(usage: Usage | null | undefined): string {
  if (!usage) {
    return 'not measured yet';
  }
  return `SM ${percent(usage.sm_now)} (1h ${percent(usage.sm_last_hour)}), ${size(usage.memory_now_bytes)}`;
}

/** The last `count` minutes up to `now`, oldest first, one value each; null where unread. */
export function minuteValues(minutes: Usage['minutes'], now: number, count = 60): (number | null)[] {
  const byStart = new Map<number, number | null>();
  for (const m of minutes ?? []) {
    byStart.set(Math.floor(m[0]), m[1]);
  }
  const last = Math.floor(now / 60) * 60;
  const out: (number | null)[] = [];
  for (let i = count - 1; i >= 0; i--) {
    const v = byStart.get(last - 60 * i);
    out.push(v === undefined ? null : v);
  }
  return out;
}

/**
 * A sparkline's shapes for `values` (0 to `top`, oldest first) across `width` × `height`:
 * `runs` the polylines' points between gaps, `dots` the values alone between gaps, `last`
 * the newest value (drawn bigger), `start` the x of the oldest value (null: none), before
 * which the axis is drawn as "not read yet" (a young server's hour is mostly that). The same
 * rules as jupyter_gpushare/charts.py.
 */
export interface Spark {
  width: number;
  height: number;
  runs: string[];
  dots: [number, number][];
  last: [number, number] | null;
  start: number | null;
}

const coordinate = (x: number): string => String(Math.round(x * 10) / 10);

export function sparkline(values: (number | null)[], width = 80, height = 18, top = 1): Spark {
  const step = (width - 3) / Math.max(1, values.length - 1);
  const point = (i: number, v: number): [number, number] => {
    const c = Math.min(Math.max(v, 0), top);
    return [1.5 + i * step, height - 1.5 - (c / top) * (height - 3)];
  };
  const spark: Spark = { width, height, runs: [], dots: [], last: null, start: null };
  let run: [number, number][] = [];
  const close = (): void => {
    if (run.length === 1) {
      spark.dots.push(run[0]);
    } else if (run.length > 1) {
      spark.runs.push(run.map(([x, y]) => `${coordinate(x)},${coordinate(y)}`).join(' '));
    }
    run = [];
  };
  values.forEach((v, i) => {
    if (v === null) {
      close();
    } else {
      run.push(point(i, v));
      spark.last = point(i, v);
      spark.start ??= spark.last[0];
    }
  });
  close();
  return spark;
}

/** The culling warning: short for the status bar, a sentence for the panel and the tooltip. */
export function cullWarning(cull: Cull, now: number): { short: string; sentence: string } {
  const left = duration(cull.cull_at - now);
  return {
    short: `idle: stops in ${left}`,
    sentence:
      `This server will be stopped at ${clockTime(cull.cull_at, now)} (in ${left}): its slice has shown no ` +
      'GPU use and the hub no activity from it. Use it (run a cell) to keep it.'
  };
}

const milli = (gpus: number): number => Math.round(gpus * 1000);

const VULGAR: Record<string, string> = {
  '1/2': '½', '1/3': '⅓', '2/3': '⅔', '1/4': '¼', '3/4': '¾', '1/5': '⅕', '2/5': '⅖',
  '3/5': '⅗', '4/5': '⅘', '1/6': '⅙', '5/6': '⅚', '1/8': '⅛', '3/8': '⅜', '5/8': '⅝',
  '7/8': '⅞', '1/10': '⅒'
};

/** A GPU amount as people write it: "4", "1.5", "0.125" (at most three decimals). */
export function gpuAmount(gpus: number): string {
  return String(milli(gpus) / 1000);
}

/** A fraction of one GPU as a glyph where one exists ("¼", "⅓"), else a decimal. */
export function fraction(gpus: number): string {
  const m = milli(gpus);
  if (m % 1000 === 0) {
    return String(m / 1000);
  }
  for (const d of [2, 3, 4, 5, 6, 8, 10]) {
    const n = Math.round((m * d) / 1000);
    // Thirds and sixths are stored rounded to milli-GPUs (333), so allow that rounding.
    if (n > 0 && n < d && Math.abs(n * 1000 - m * d) <= d) {
      const glyph = VULGAR[`${n}/${d}`];
      if (glyph) {
        return glyph;
      }
    }
  }
  return gpuAmount(gpus);
}

/**
 * How long a job has been at it, `now` in seconds since the epoch: running since it
 * started, waiting since it was submitted, or how long it ran once it ended.
 */
export function elapsed(job: Job, now: number): string {
  if (job.state === 'running' && job.started !== null) {
    return duration(now - job.started);
  }
  if (job.state === 'pending') {
    return `waiting ${duration(now - job.submitted)}`;
  }
  const end = job.finished ?? now;
  return job.started === null ? '–' : duration(end - job.started);
}

/** "Submitted 2 min ago, started just now": the moments behind the job's time. */
export function times(job: Job, now: number): string {
  const parts = [`submitted ${ago(job.submitted, now)}`];
  if (job.started !== null) {
    parts.push(`started ${ago(job.started, now)}`);
  }
  if (job.finished !== null) {
    parts.push(`ended ${ago(job.finished, now)}`);
  }
  return sentence(parts.join(', '));
}

/** One row of the job table, every cell as text. */
export interface JobRow {
  id: string;
  name: string;
  state: string;
  gpus: string;
  position: string;
  reason: string;
  elapsed: string;
  /** When it was submitted, started and ended, for the time's tooltip. */
  times: string;
  attempt: string;
  cancellable: boolean;
  followable: boolean;
  /** Ranks whose logs can be chosen (1: only rank 0, no choice to offer). */
  ranks: number;
  /** A running job on build GPUs lent to the train pool: where, and what may happen; else ''. */
  lent: string;
}

/** The suffix of a lent node's name (the pool's `policy/lending.py`, LENT_SUFFIX). */
const LENT_SUFFIX = '/lent';

/** Where a running job on lent build GPUs runs, and what may happen to it there; '' otherwise. */
export function lentText(job: Job): string {
  const placement = job.placement;
  const nodes = Object.keys(placement && typeof placement === 'object' && !Array.isArray(placement) ? placement : {})
    .filter(name => name.length > LENT_SUFFIX.length && name.endsWith(LENT_SUFFIX))
    .map(name => name.slice(0, -LENT_SUFFIX.length))
    .sort();
  if (job.state !== 'running' || nodes.length === 0) {
    return '';
  }
  return (
    `on build GPUs of ${nodes.join(', ')} lent to the train pool: a notebook may take ` +
    'them back (the job is then requeued, to start again from its last checkpoint)'
  );
}

export function jobRow(job: Job, now: number): JobRow {
  const live = job.state === 'pending' || job.state === 'running';
  let state: string = job.state;
  if (job.state === 'failed' && job.exit_code !== null) {
    state = `failed (exit ${job.exit_code})`;
  } else if (job.state === 'running' && job.preempting) {
    state = 'running (preempted)';
  } else if (job.state === 'pending' && job.attempt > 1) {
    state = 'pending (requeued)';
  }
  return {
    id: job.id,
    name: job.name || job.id,
    state,
    gpus: gpuAmount(job.gpus),
    position: job.state === 'pending' && job.queue_position !== null ? `#${job.queue_position}` : '',
    reason: job.reason,
    elapsed: elapsed(job, now),
    times: times(job, now),
    attempt: String(job.attempt),
    cancellable: live,
    followable: job.state !== 'pending' || job.attempt > 1,
    ranks: Math.max(1, job.ranks ?? 1),
    lent: lentText(job)
  };
}

/** Live jobs first (running, then pending by queue position), then the rest newest first. */
export function sortJobs(jobs: Job[]): Job[] {
  const rank = (j: Job): number => (j.state === 'running' ? 0 : j.state === 'pending' ? 1 : 2);
  return [...jobs].sort((a, b) => {
    const r = rank(a) - rank(b);
    if (r !== 0) {
      return r;
    }
    if (a.state === 'pending') {
      return (a.queue_position ?? Infinity) - (b.queue_position ?? Infinity);
    }
    return b.submitted - a.submitted || a.id.localeCompare(b.id);
  });
}

/**
 * One project's quota bar. The bar's full width is `scale` GPUs (the same for every project
 * of the panel, so bars compare); `used` is in use within the guarantee, `borrowed` beyond it,
 * `free` the guaranteed GPUs not in use; `quotaAt` marks where the guarantee ends. Percentages
 * add up to at most 100.
 */
export interface QuotaBar {
  used: number;
  borrowed: number;
  free: number;
  quotaAt: number;
  label: string;
}

export function barScale(projects: Array<Project | Department>): number {
  return Math.max(1000, ...projects.map(p => Math.max(milli(p.quota), milli(p.in_use)))) / 1000;
}

/**
 * A department's bar, drawn as a project's: what its projects hold together against the
 * department's quota; the label names them.
 */
/** A department's bar: only its projects' quotas are guaranteed, so its own quota is said as
 * what it is, their first claim on idle GPUs. */
export function departmentBar(department: Department, scale: number): QuotaBar {
  const bar = quotaBar({ ...department, pending: 0 }, scale);
  const by = department.projects.length
    ? `its projects (${department.projects.join(', ')})`
    : 'no project';
  const beyond = Math.max(0, milli(department.in_use) - milli(department.quota));
  bar.label =
    `${gpuAmount(department.in_use)} in use by ${by}, quota ${gpuAmount(department.quota)}` +
    (beyond > 0 ? ` · ${gpuAmount(beyond / 1000)} borrowed` : '');
  return bar;
}

export function quotaBar(project: Project, scale: number): QuotaBar {
  const full = Math.max(milli(scale), milli(project.quota), milli(project.in_use), 1);
  const quota = milli(project.quota);
  const inUse = milli(project.in_use);
  const used = Math.min(inUse, quota);
  const borrowed = Math.max(0, inUse - quota);
  const pct = (m: number): number => Math.round((m * 1000) / full) / 10;
  let label = `${gpuAmount(project.in_use)} of ${gpuAmount(project.quota)} guaranteed in use`;
  if (borrowed > 0) {
    label += ` · ${gpuAmount(borrowed / 1000)} borrowed`;
    if (project.lent) {
      label += ` (${gpuAmount(project.lent)} on lent build GPUs)`;
    }
  }
  if (project.pending > 0) {
    label += ` · ${project.pending} queued`;
  }
  return {
    used: pct(used),
    borrowed: pct(borrowed),
    free: pct(quota - used),
    quotaAt: pct(quota),
    label
  };
}

/**
 * The status bar text, e.g. "GPU ¼ · vision 4/2 · 1 queued": the build slice, the projects
 * the user has GPUs in (in use/guaranteed; the only project when none), and the user's own
 * running and queued jobs. `error` set: the pool cannot be reached.
 */
export function statusText(
  slice: BuildSlice | null,
  quota: Quota | null,
  error: string | null,
  now: number = Date.now() / 1000
): string {
  const parts = [slice ? `GPU ${fraction(slice.gpus)}${slice.over ? ' ⚠' : ''}` : 'GPU –'];
  if (slice?.cull) {
    parts.push(`⚠ ${cullWarning(slice.cull, now).short}`);
  }
  if (error !== null || quota === null) {
    parts.push(error !== null ? 'pool unreachable' : 'pool …');
    return parts.join(' · ');
  }
  let shown = quota.projects.filter(p => milli(p.in_use) > 0);
  if (shown.length === 0 && quota.projects.length === 1) {
    shown = quota.projects;
  }
  for (const p of shown.slice(0, 2)) {
    parts.push(`${p.name} ${gpuAmount(p.in_use)}/${gpuAmount(p.quota)}`);
  }
  if (shown.length > 2) {
    parts.push(`+${shown.length - 2} projects`);
  }
  const running = quota.jobs.running ?? 0;
  const pending = quota.jobs.pending ?? 0;
  if (running > 0) {
    parts.push(`${running} running`);
  }
  if (pending > 0) {
    parts.push(`${pending} queued`);
  }
  return parts.join(' · ');
}

/** The status bar's tooltip: the same, spelled out. */
export function statusTitle(
  slice: BuildSlice | null,
  quota: Quota | null,
  error: string | null,
  now: number = Date.now() / 1000
): string {
  const lines = [
    slice
      ? `This notebook server holds ${gpuAmount(slice.gpus)} of a build GPU.`
      : 'This notebook server holds no build GPU slice.'
  ];
  if (slice?.usage) {
    const idle = idleText(slice.usage.idle_for_s);
    lines.push(`GPU use: ${usageText(slice.usage)}${idle ? `, ${idle}` : ''}.`);
  }
  if (slice?.cull) {
    lines.push(cullWarning(slice.cull, now).sentence);
  }
  if (slice?.over && slice.message) {
    lines.push(slice.message);
  }
  if (error !== null) {
    lines.push(error);
  } else if (quota !== null) {
    for (const p of quota.projects) {
      lines.push(`${p.name}: ${quotaBar(p, p.quota).label}.`);
    }
  }
  lines.push('Click for the gpushare panel.');
  return lines.join('\n');
}

/** What the "Run as train job" dialog sends: the pool's job spec. */
export interface TrainSpec {
  gpus: number;
  project?: string;
  name?: string;
  command: string[];
  workdir?: string;
  per_gpu?: boolean;
}

/** What the user typed into the dialog. */
export interface TrainForm {
  gpus: string;
  project: string;
  name: string;
  /** One rank per GPU (each with its LOCAL_RANK) instead of one per node. */
  perGpu?: boolean;
}

/** What the dialog knows of the pool to check the form against before sending it. */
export interface TrainLimits {
  projects: Project[];
  capacity: number | null;
}

/** The file to run: its path under the server root, the root, and the Python to run it. */
export interface TrainTarget {
  path: string;
  serverRoot: string;
  python: string;
}

/**
 * The job spec for a script, or one sentence saying what to fix. The pool checks it all
 * again; this only spares a round trip and says it next to the field.
 */
export function trainSpec(
  form: TrainForm,
  limits: TrainLimits,
  target: TrainTarget
): { spec: TrainSpec } | { error: string } {
  const text = form.gpus.trim();
  if (!/^\d+$/.test(text) || Number(text) < 1) {
    return { error: `GPUs must be a whole number of GPUs, 1 or more, not "${form.gpus}".` };
  }
  const gpus = Number(text);
  if (limits.capacity !== null && gpus > limits.capacity) {
    return {
      error: `The train pool has ${gpuAmount(limits.capacity)} GPUs; ask for ${gpuAmount(limits.capacity)} or fewer.`
    };
  }
  const names = limits.projects.map(p => p.name);
  let project = limits.projects.find(p => p.name === form.project);
  if (form.project === '') {
    if (limits.projects.length > 1) {
      return { error: `Choose a project: you are in ${names.join(', ')}.` };
    }
    project = limits.projects[0];
  } else if (project === undefined) {
    return {
      error: `You are not in project "${form.project}"; yours: ${names.join(', ') || 'none'}.`
    };
  }
  if (project && project.limit !== null && milli(gpus) > milli(project.limit)) {
    return {
      error: `Project ${project.name} may use at most ${gpuAmount(project.limit)} GPUs; ask for fewer.`
    };
  }
  const name = form.name.trim();
  if (name.length > 100) {
    return { error: 'The name may have at most 100 characters.' };
  }
  const slash = target.path.lastIndexOf('/');
  const dir = slash < 0 ? '' : target.path.slice(0, slash);
  const file = target.path.slice(slash + 1);
  if (!file.endsWith('.py')) {
    return { error: `Only Python scripts (.py) run as train jobs, not ${file}.` };
  }
  const root = target.serverRoot.replace(/\/+$/, '');
  const spec: TrainSpec = { gpus, command: [target.python, file], name: name || file };
  if (root) {
    // Without the root (an unusual server) the job runs in the user's home directory.
    spec.workdir = dir ? `${root}/${dir}` : root;
  }
  if (project) {
    spec.project = project.name;
  }
  if (form.perGpu) {
    spec.per_gpu = true;
  }
  return { spec };
}

/** A sentence as the panel shows it: capital first, a full stop last. */
export function sentence(text: string): string {
  const t = text.trim();
  if (!t) {
    return t;
  }
  const capital = t[0].toUpperCase() + t.slice(1);
  return /[.!?)]$/.test(capital) ? capital : `${capital}.`;
}

/** The pool's error sentence from a JSON body, or one made from the HTTP status. */
export function errorMessage(status: number, body: string): string {
  try {
    const parsed = JSON.parse(body);
    if (parsed && typeof parsed.error === 'string' && parsed.error) {
      return parsed.error;
    }
  } catch {
    // not JSON: a proxy's or the server's own page
  }
  if (status === 502 || status === 503 || status === 504) {
    return `The gpushare pool cannot be reached (HTTP ${status}).`;
  }
  if (status === 404) {
    return 'The gpushare server extension is not enabled in this notebook server (HTTP 404).';
  }
  return `The gpushare request failed (HTTP ${status}).`;
}

/** How a call is tried again while the pool (or this server) cannot be reached. */
export interface RetryOptions {
  /** Called once per outage with one sentence, e.g. to show a notification. */
  onRetry?: (sentence: string) => void;
  /** How long to keep trying, in milliseconds (default 20 s: the pool is back within seconds). */
  budgetMs?: number;
  /** The first pause; it doubles up to `maxPauseMs` (defaults 250 ms and 2 s). */
  firstPauseMs?: number;
  maxPauseMs?: number;
  sleep?: (ms: number) => Promise<void>;
  now?: () => number;
}

export const RESTARTING = 'The pool service is not answering (it may be restarting); trying again.';

/**
 * `call()`, tried again with a growing pause while it fails with an error for which
 * `unreachable(error)` is true, for at most `budgetMs`; any other error is thrown at once. A
 * submit retried this way carries the same Idempotency-Key, so it never makes two jobs.
 */
export async function retrying<T>(
  call: () => Promise<T>,
  unreachable: (error: unknown) => boolean,
  options: RetryOptions = {}
): Promise<T> {
  const now = options.now ?? (() => Date.now());
  const sleep = options.sleep ?? ((ms: number) => new Promise<void>(resolve => setTimeout(resolve, ms)));
  const deadline = now() + (options.budgetMs ?? 20000);
  let pause = options.firstPauseMs ?? 250;
  let told = false;
  for (;;) {
    try {
      return await call();
    } catch (error) {
      const left = deadline - now();
      if (!unreachable(error) || left <= 0) {
        throw error;
      }
      if (!told) {
        options.onRetry?.(RESTARTING);
        told = true;
      }
      await sleep(Math.min(pause, left));
      pause = Math.min(pause * 2, options.maxPauseMs ?? 2000);
    }
  }
}

/** A new key for one submit (32 hex digits), from `random(n)` bytes (crypto by default). */
export function newRequestId(
  random: (n: number) => Uint8Array = n => globalThis.crypto.getRandomValues(new Uint8Array(n))
): string {
  return Array.from(random(16), b => b.toString(16).padStart(2, '0')).join('');
}
