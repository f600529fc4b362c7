// Unit tests of the panel's and status bar's logic (src/model.ts) with Node's test runner:
// `npm test` compiles them with tsconfig.test.json and runs `node --test`.
import { strict as assert } from 'node:assert';
import { describe, test } from 'node:test';

import {
  BuildSlice,
  Job,
  Project,
  Quota,
  Usage,
  barScale,
  buildSlice,
  cullWarning,
  elapsed,
  errorMessage,
  fraction,
  gpuAmount,
  idleText,
  jobRow,
  minuteValues,
  newRequestId,
  percent,
  departmentBar,
  quotaBar,
  retrying,
  sentence,
  size,
  sortJobs,
  sparkline,
  statusText,
  statusTitle,
  times,
  trainSpec,
  usageText
} from '../src/model';
import { ago, clockTime, duration } from '../src/format';

function project(name: string, quota: number, inUse: number, extra: Partial<Project> = {}): Project {
  return {
    name,
    quota,
    limit: null,
    in_use: inUse,
    borrowed: Math.max(0, inUse - quota),
    deserved: quota,
    pending: 0,
    ...extra
  };
}

function job(extra: Partial<Job>): Job {
  return {
    id: 'j1',
    name: 'train',
    user: 'alice',
    project: 'vision',
    gpus: 2,
    priority: 0,
    state: 'pending',
    attempt: 1,
    queue_position: null,
    reason: '',
    submitted: 1000,
    started: null,
    finished: null,
    exit_code: null,
    ...extra
  };
}

function quota(projects: Project[], jobs: Quota['jobs'] = {}): Quota {
  return { user: 'alice', admin: false, projects, jobs };
}

describe('GPU amounts', () => {
  test('fractions of one GPU are glyphs, thirds despite milli rounding', () => {
    assert.equal(fraction(0.25), '¼');
    assert.equal(fraction(0.5), '½');
    assert.equal(fraction(0.125), '⅛');
    assert.equal(fraction(0.333), '⅓');
    assert.equal(fraction(0.667), '⅔');
    assert.equal(fraction(1), '1');
    assert.equal(fraction(0.3), '0.3');
    assert.equal(fraction(0.35), '0.35');
  });

  test('amounts have at most three decimals and no float noise', () => {
    assert.equal(gpuAmount(4), '4');
    assert.equal(gpuAmount(0.1 + 0.2), '0.3');
    assert.equal(gpuAmount(1.0005), '1.001');
  });
});

describe('durations', () => {
  test('short forms at each scale', () => {
    assert.equal(duration(0), '0s');
    assert.equal(duration(-5), '0s');
    assert.equal(duration(59.9), '59s');
    assert.equal(duration(70), '1m 10s');
    assert.equal(duration(125), '2m 05s');
    assert.equal(duration(2 * 3600 + 5 * 60 + 30), '2h 05m');
    assert.equal(duration(3600 + 120), '1h 02m');
    assert.equal(duration(3 * 86400 + 4 * 3600 + 59), '3d 4h');
  });

  test('elapsed: running since start, waiting since submit, ran until finish', () => {
    assert.equal(elapsed(job({ state: 'running', started: 1010 }), 1100), '1m 30s');
    assert.equal(elapsed(job({ state: 'pending' }), 1005), 'waiting 5s');
    assert.equal(elapsed(job({ state: 'succeeded', started: 1000, finished: 1042 }), 9999), '42s');
    assert.equal(elapsed(job({ state: 'cancelled', finished: 1003 }), 9999), '–');
  });
});

describe('times', () => {
  // 2024-03-12 14:05:00 UTC
  const T = Date.UTC(2024, 2, 12, 14, 5) / 1000;
  const utc = { locale: 'en-GB', timeZone: 'UTC' };

  test('recent events are relative, older ones a clock time in the locale', () => {
    assert.equal(ago(T, T + 59, utc), 'just now');
    assert.equal(ago(T, T - 5, utc), 'just now'); // a clock a little ahead
    assert.equal(ago(T, T + 60, utc), '1 min ago');
    assert.equal(ago(T, T + 3599, utc), '59 min ago');
    assert.equal(ago(T, T + 3600, utc), '14:05');
    assert.equal(ago(T, T + 86400, utc), '12 Mar, 14:05');
  });

  test('the clock time is hour and minute as the locale writes them', () => {
    assert.equal(clockTime(T, T, utc), '14:05');
    assert.equal(clockTime(T, T, { locale: 'en-US', timeZone: 'UTC' }), '2:05 PM');
    assert.equal(clockTime(T, T, { locale: 'en-GB', timeZone: 'Asia/Tokyo' }), '23:05');
  });

  test("a job's moments for its time's tooltip", () => {
    const now = 100000;
    assert.equal(times(job({ submitted: now - 30 }), now), 'Submitted just now.');
    const ended = job({ state: 'succeeded', submitted: now - 600, started: now - 540, finished: now - 20 });
    assert.equal(times(ended, now), 'Submitted 10 min ago, started 9 min ago, ended just now.');
  });
});

describe('job table rows', () => {
  test('a pending job shows its queue position and reason and can be cancelled', () => {
    const row = jobRow(job({ queue_position: 2, reason: 'waiting for 2 GPUs' }), 1001);
    assert.deepEqual(
      [row.name, row.state, row.gpus, row.position, row.reason, row.elapsed, row.attempt],
      ['train', 'pending', '2', '#2', 'waiting for 2 GPUs', 'waiting 1s', '1']
    );
    assert.equal(row.cancellable, true);
    assert.equal(row.followable, false);
  });

  test('requeued, preempted and failed jobs say so', () => {
    assert.equal(jobRow(job({ attempt: 2 }), 0).state, 'pending (requeued)');
    assert.equal(jobRow(job({ attempt: 2 }), 0).followable, true);
    assert.equal(jobRow(job({ state: 'running', started: 0, preempting: true }), 0).state, 'running (preempted)');
    const failed = jobRow(job({ state: 'failed', exit_code: 3, started: 0, finished: 1 }), 5);
    assert.equal(failed.state, 'failed (exit 3)');
    assert.equal(failed.cancellable, false);
    assert.equal(failed.position, '');
  });

  test('a running job on lent build GPUs says so, and what may happen to it', () => {
    const lent = jobRow(job({ state: 'running', started: 0, placement: { 'build-0/lent': 1 } }), 5);
    assert.equal(
      lent.lent,
      'on build GPUs of build-0 lent to the train pool: a notebook may take them back ' +
        '(the job is then requeued, to start again from its last checkpoint)'
    );
    assert.equal(jobRow(job({ state: 'running', started: 0, placement: { 'train-0': 1 } }), 5).lent, '');
    assert.equal(jobRow(job({ placement: { 'build-0/lent': 1 } }), 5).lent, '');
  });

  test('a job without a name is shown by its id', () => {
    assert.equal(jobRow(job({ name: '', id: 'abc123' }), 0).name, 'abc123');
  });

  test('a distributed job offers the logs of each of its ranks', () => {
    assert.equal(jobRow(job({}), 0).ranks, 1);
    assert.equal(jobRow(job({ ranks: null }), 0).ranks, 1);
    assert.equal(jobRow(job({ state: 'running', started: 0, ranks: 8, per_gpu: true }), 0).ranks, 8);
  });

  test('running first, then pending by position, then ended newest first', () => {
    const jobs = [
      job({ id: 'old', state: 'succeeded', submitted: 1 }),
      job({ id: 'p2', queue_position: 2 }),
      job({ id: 'new', state: 'failed', submitted: 5 }),
      job({ id: 'run', state: 'running', started: 3 }),
      job({ id: 'p1', queue_position: 1 })
    ];
    assert.deepEqual(sortJobs(jobs).map(j => j.id), ['run', 'p1', 'p2', 'new', 'old']);
  });
});

describe('quota bars', () => {
  test('within quota: used and free guaranteed fill the guarantee', () => {
    const bar = quotaBar(project('vision', 4, 1), 4);
    assert.deepEqual([bar.used, bar.borrowed, bar.free, bar.quotaAt], [25, 0, 75, 100]);
    assert.equal(bar.label, '1 of 4 guaranteed in use');
  });

  test('borrowing: the part beyond the quota is borrowed, the mark at the quota', () => {
    const bar = quotaBar(project('vision', 2, 4, { pending: 1 }), 4);
    assert.deepEqual([bar.used, bar.borrowed, bar.free, bar.quotaAt], [50, 50, 0, 50]);
    assert.equal(bar.label, '4 of 2 guaranteed in use · 2 borrowed · 1 queued');
  });

  test('a job on a lent build GPU is in use and borrowed, and said so', () => {
    const bar = quotaBar(project('nlp', 2, 9, { lent: 1 }), 9);
    assert.equal(bar.label, '9 of 2 guaranteed in use · 7 borrowed (1 on lent build GPUs)');
  });

  test('one scale for all bars, so that they compare; never over 100%', () => {
    const projects = [project('a', 2, 0), project('b', 1, 6)];
    assert.equal(barScale(projects), 6);
    const a = quotaBar(projects[0], barScale(projects));
    assert.equal(Math.round(a.quotaAt), 33);
    for (const p of projects) {
      const bar = quotaBar(p, barScale(projects));
      assert.ok(bar.used + bar.borrowed + bar.free <= 100.05);
    }
    assert.equal(barScale([]), 1);
  });

  test("a department's bar: its projects together against its quota, named", () => {
    const research = { name: 'research', quota: 4, limit: null, projects: ['nlp', 'vision'], in_use: 6, borrowed: 2, deserved: 6 };
    const bar = departmentBar(research, barScale([research, project('vision', 2, 1)]));
    assert.deepEqual([bar.used, bar.borrowed, bar.free, bar.quotaAt], [66.7, 33.3, 0, 66.7]);
    assert.equal(bar.label, '6 in use by its projects (nlp, vision), quota 4 · 2 borrowed');
  });

  test('a project with no quota only borrows', () => {
    const bar = quotaBar(project('nlp', 0, 2), 2);
    assert.deepEqual([bar.used, bar.borrowed, bar.free, bar.quotaAt], [0, 100, 0, 0]);
  });
});

const NOW = 1_800_000_030; // 30 s into a minute
const MINUTE = Math.floor(NOW / 60) * 60;
const USAGE: Usage = {
  sm_now: 0.93,
  memory_now_bytes: 11 * 2 ** 30,
  sm_last_hour: 0.88,
  memory_peak_last_hour_bytes: 12 * 2 ** 30,
  idle_for_s: null,
  idle: false,
  at: NOW,
  minutes: [
    [MINUTE - 120, 0.8, 0],
    [MINUTE, 0.95, 0]
  ]
};

function quarter(extra: Partial<BuildSlice> = {}): BuildSlice {
  return { gpus: 0.25, over: false, message: '', usage: null, cull: null, ...extra };
}

describe('GPU use in words, as gpushare jobs and %gpushare say it', () => {
  test('percentages, sizes and idle flags', () => {
    assert.deepEqual([0.934, 0, 1, null, undefined].map(percent), ['93%', '0%', '100%', '-', '-']);
    assert.deepEqual([11 * 2 ** 30, 1.5 * 2 ** 30, 300 * 2 ** 20, null].map(size), ['11 GiB', '1.5 GiB', '300 MiB', '-']);
    assert.deepEqual([null, 59, 60, 1500, 7200, 3 * 86400].map(idleText), ['', '', 'idle 1m 00s', 'idle 25m 00s', 'idle 2h 00m', 'idle 3d 0h']);
    assert.equal(usageText(USAGE), 'SM 93% (1h 88%), 11 GiB');
    assert.equal(usageText({ ...USAGE, sm_now: null, sm_last_hour: null }), 'SM - (1h -), 11 GiB');
    assert.equal(usageText(null), 'not measured yet');
  });

  test('the last hour minute by minute, gaps where nothing was read', () => {
    const values = minuteValues(USAGE.minutes, NOW);
    assert.equal(values.length, 60);
    assert.deepEqual(values.slice(56), [null, 0.8, null, 0.95]);
    assert.deepEqual(minuteValues(undefined, NOW, 3), [null, null, null]);
  });

  test('a sparkline breaks at gaps and marks its last value (as charts.py draws it)', () => {
    assert.deepEqual(sparkline([0.5, null, 0.2, 0.4, 1.2], 20, 10), {
      width: 20,
      height: 10,
      runs: ['10,7.1 14.3,5.7 18.5,1.5'],
      dots: [[1.5, 5]],
      last: [18.5, 1.5],
      start: 1.5
    });
    assert.deepEqual(sparkline([null, null]), { width: 80, height: 18, runs: [], dots: [], last: null, start: null });
  });

  test('the culling warning: short in the status bar, a sentence in the panel', () => {
    const cull = { warned_at: NOW - 60, cull_at: NOW + 480, reason: 'no GPU use and no activity for 31 min' };
    assert.deepEqual(cullWarning(cull, NOW), {
      short: 'idle: stops in 8m 00s',
      sentence:
        `This server will be stopped at ${clockTime(NOW + 480, NOW)} (in 8m 00s): its slice has shown no GPU ` +
        'use and the hub no activity from it. Use it (run a cell) to keep it.'
    });
    const q = quota([project('vision', 2, 0)]);
    assert.equal(statusText(quarter({ cull }), q, null, NOW), 'GPU ¼ · ⚠ idle: stops in 8m 00s · vision 0/2');
    const title = statusTitle(quarter({ cull, usage: { ...USAGE, idle_for_s: 1860 } }), q, null, NOW).split('\n');
    assert.deepEqual(title.slice(0, 3), [
      'This notebook server holds 0.25 of a build GPU.',
      'GPU use: SM 93% (1h 88%), 11 GiB, idle 31m 00s.',
      cullWarning(cull, NOW).sentence
    ]);
  });
});

describe('status bar text', () => {
  test('slice, projects in use, queued', () => {
    const q = quota([project('vision', 2, 4), project('nlp', 1, 0)], { pending: 1, running: 0 });
    assert.equal(statusText(quarter(), q, null), 'GPU ¼ · vision 4/2 · 1 queued');
  });

  test('the only project shows even when idle; running jobs counted', () => {
    assert.equal(statusText(null, quota([project('vision', 2, 0)], { running: 2 }), null), 'GPU – · vision 0/2 · 2 running');
  });

  test('at most two projects, the rest counted', () => {
    const q = quota([project('a', 1, 1), project('b', 1, 1), project('c', 1, 1)]);
    assert.equal(statusText({ ...quarter(), gpus: 0.5 }, q, null), 'GPU ½ · a 1/1 · b 1/1 · +1 projects');
  });

  test('a slice over its memory is flagged', () => {
    const q = quota([project('vision', 2, 0)]);
    assert.equal(statusText({ ...quarter(), over: true, message: 'm' }, q, null), 'GPU ¼ ⚠ · vision 0/2');
  });

  test("the slice route's answer", () => {
    assert.equal(buildSlice({ slice: null, watchdog: null }), null);
    assert.equal(buildSlice(null), null);
    assert.deepEqual(buildSlice({ slice: { gpus: 0.25, uuid: 'GPU-1' }, watchdog: null }), {
      gpus: 0.25,
      over: false,
      message: '',
      usage: null,
      cull: null
    });
    assert.deepEqual(
      buildSlice({ slice: { gpus: 0.5 }, watchdog: { over: true, message: 'uses 30 GiB of 20' } }),
      { gpus: 0.5, over: true, message: 'uses 30 GiB of 20', usage: null, cull: null }
    );
    const cull = { warned_at: 100, cull_at: 400, reason: 'no GPU use' };
    assert.deepEqual(buildSlice({ slice: { gpus: 0.25 }, watchdog: null, pool: { id: 's', usage: USAGE, cull } }), {
      gpus: 0.25,
      over: false,
      message: '',
      usage: USAGE,
      cull
    });
    assert.equal(buildSlice({ slice: { gpus: 0.25 }, pool: { cull: { reason: 'no time' } } })?.cull, null);
  });

  test('an unreachable pool says so', () => {
    assert.equal(statusText(quarter(), quota([]), 'x'), 'GPU ¼ · pool unreachable');
    assert.equal(statusText(null, null, null), 'GPU – · pool …');
  });
});

describe('Run as train job: checking the form', () => {
  const limits = { projects: [project('vision', 2, 0, { limit: 4 }), project('nlp', 2, 0)], capacity: 8 };
  const target = { path: 'work/train.py', serverRoot: '/home/alice/', python: '/opt/py/bin/python' };

  test('a good form makes the pool job spec, in the script folder', () => {
    const out = trainSpec({ gpus: ' 2 ', project: 'vision', name: '' }, limits, target);
    assert.deepEqual(out, {
      spec: {
        gpus: 2,
        project: 'vision',
        name: 'train.py',
        command: ['/opt/py/bin/python', 'train.py'],
        workdir: '/home/alice/work'
      }
    });
  });

  test('one process per GPU when asked', () => {
    const out = trainSpec({ gpus: '4', project: 'vision', name: 'x', perGpu: true }, limits, target);
    assert.ok('spec' in out && out.spec.per_gpu === true);
    const plain = trainSpec({ gpus: '4', project: 'vision', name: 'x', perGpu: false }, limits, target);
    assert.ok('spec' in plain && !('per_gpu' in plain.spec));
  });

  test('a script at the root runs in the root; without a root, in the home directory', () => {
    const one = { projects: [project('vision', 2, 0)], capacity: 8 };
    const atRoot = trainSpec({ gpus: '1', project: '', name: 'x' }, one, { ...target, path: 't.py' });
    assert.ok('spec' in atRoot && atRoot.spec.workdir === '/home/alice' && atRoot.spec.project === 'vision');
    const noRoot = trainSpec({ gpus: '1', project: '', name: 'x' }, one, { ...target, serverRoot: '' });
    assert.ok('spec' in noRoot && !('workdir' in noRoot.spec));
  });

  const bad: [string, Partial<{ gpus: string; project: string; name: string }>, RegExp][] = [
    ['zero GPUs', { gpus: '0' }, /whole number of GPUs, 1 or more, not "0"/],
    ['words', { gpus: 'abc' }, /not "abc"/],
    ['fractions', { gpus: '1.5' }, /whole number/],
    ['empty', { gpus: '' }, /whole number/],
    ['more than the pool', { gpus: '9' }, /train pool has 8 GPUs; ask for 8 or fewer/],
    ['over the project limit', { gpus: '5' }, /vision may use at most 4 GPUs/],
    ['no project among several', { project: '' }, /Choose a project: you are in vision, nlp/],
    ['a project not yours', { project: 'audio' }, /not in project "audio"; yours: vision, nlp/],
    ['a long name', { name: 'n'.repeat(101) }, /at most 100 characters/]
  ];
  for (const [what, change, message] of bad) {
    test(`refuses ${what} with one sentence`, () => {
      const out = trainSpec({ gpus: '1', project: 'vision', name: '', ...change }, limits, target);
      assert.ok('error' in out, what);
      assert.match(out.error, message);
      assert.match(out.error, /^[A-Z].*\.$/);
    });
  }

  test('only .py files', () => {
    const out = trainSpec({ gpus: '1', project: 'vision', name: '' }, limits, { ...target, path: 'a/notes.txt' });
    assert.ok('error' in out && /Only Python scripts/.test(out.error));
  });
});

describe('error sentences', () => {
  test("the pool's own sentence is kept", () => {
    assert.equal(errorMessage(409, '{"error": "job x has already ended (succeeded)"}'), 'job x has already ended (succeeded)');
  });

  test('sentences start with a capital and end with a stop', () => {
    assert.equal(sentence('the pool service at http://x/ cannot be reached; is JupyterHub running?'),
      'The pool service at http://x/ cannot be reached; is JupyterHub running?');
    assert.equal(sentence('job x is not yours'), 'Job x is not yours.');
    assert.equal(sentence(''), '');
  });

  test('gateways and missing routes get a sentence of their own', () => {
    assert.match(errorMessage(502, '<html>'), /pool cannot be reached \(HTTP 502\)/);
    assert.match(errorMessage(404, ''), /server extension is not enabled/);
    assert.equal(errorMessage(500, 'oops'), 'The gpushare request failed (HTTP 500).');
  });
});

describe('retrying through a pool restart', () => {
  const unreachable = (e: unknown) => (e as Error).message === 'down';
  function clock() {
    let t = 0;
    return { now: () => t, sleep: async (ms: number) => void (t += ms), slept: () => t };
  }

  test('tries again while unreachable, tells once, and returns the answer', async () => {
    const c = clock();
    const told: string[] = [];
    let calls = 0;
    const answer = await retrying(
      async () => {
        calls += 1;
        if (calls < 4) {
          throw new Error('down');
        }
        return 'job';
      },
      unreachable,
      { onRetry: text => told.push(text), now: c.now, sleep: c.sleep }
    );
    assert.equal(answer, 'job');
    assert.equal(calls, 4);
    assert.equal(told.length, 1);
    assert.match(told[0], /restarting/);
    assert.equal(c.slept(), 250 + 500 + 1000);
  });

  test('gives up after its budget, and never retries a refusal', async () => {
    const c = clock();
    await assert.rejects(
      retrying(async () => Promise.reject(new Error('down')), unreachable, {
        budgetMs: 3000,
        now: c.now,
        sleep: c.sleep
      }),
      /down/
    );
    assert.equal(c.slept(), 3000);
    let calls = 0;
    await assert.rejects(
      retrying(
        async () => {
          calls += 1;
          throw new Error('not yours');
        },
        unreachable,
        { now: c.now, sleep: c.sleep }
      ),
      /not yours/
    );
    assert.equal(calls, 1);
  });

  test('request ids are 32 hex digits, new each time', () => {
    assert.equal(newRequestId(n => new Uint8Array(n).fill(171)), 'ab'.repeat(16));
    assert.match(newRequestId(), /^[0-9a-f]{32}$/);
    assert.notEqual(newRequestId(), newRequestId());
  });
});
