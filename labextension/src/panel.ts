/**
 * The side panel: one line saying whether the pool answers, this server's slice and its GPU
 * use (with the culling warning while it is warned), a quota bar per project, the user's jobs
 * with their GPU use, cancel and logs, and a log viewer that follows a running job. Every text
 * from the pool goes in through textContent, never as HTML.
 */
import { showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { ago } from './format';
import {
  Job,
  Usage,
  barScale,
  departmentBar,
  cullWarning,
  gpuAmount,
  idleText,
  jobRow,
  minuteValues,
  QuotaBar,
  quotaBar,
  sparkline,
  usageText
} from './model';
import { GpushareModel } from './poller';

const SVG = 'http://www.w3.org/2000/svg';

/**
 * A sparkline of the last hour's SM utilization, drawn from model.ts's shapes: the whole hour
 * always, now at the right; the axis is dotted where nothing was read (a server younger than
 * an hour).
 */
function sparkSvg(values: (number | null)[]): SVGSVGElement {
  const spark = sparkline(values, 60, 16);
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'jp-GpusharePanel-spark');
  svg.setAttribute('width', String(spark.width));
  svg.setAttribute('height', String(spark.height));
  svg.setAttribute('viewBox', `0 0 ${spark.width} ${spark.height}`);
  const title = document.createElementNS(SVG, 'title');
  title.textContent = 'SM utilization, last hour';
  // The axis: solid where the hour was read, dotted before the first reading.
  const start = spark.start ?? spark.width;
  const axis = (x1: number, x2: number, className: string): void => {
    const line = document.createElementNS(SVG, 'line');
    const y = String(spark.height - 0.5);
    line.setAttribute('x1', String(x1));
    line.setAttribute('x2', String(x2));
    line.setAttribute('y1', y);
    line.setAttribute('y2', y);
    line.setAttribute('class', className);
    svg.append(line);
  };
  svg.append(title);
  if (start > 0) {
    axis(0, start, 'jp-GpusharePanel-sparkUnread');
  }
  axis(start, spark.width, 'jp-GpusharePanel-sparkBase');
  for (const points of spark.runs) {
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute('points', points);
    svg.append(line);
  }
  const dot = (x: number, y: number, r: number): void => {
    const c = document.createElementNS(SVG, 'circle');
    c.setAttribute('cx', String(x));
    c.setAttribute('cy', String(y));
    c.setAttribute('r', String(r));
    svg.append(c);
  };
  spark.dots.forEach(([x, y]) => dot(x, y, 1));
  if (spark.last) {
    dot(spark.last[0], spark.last[1], 2);
  }
  return svg;
}

const COLUMNS = ['State', 'GPUs', 'Time'];

const EMPTY =
  'No train jobs yet. Run one from a notebook with a %%train cell, from a terminal with ' +
  'gpushare submit, or right-click a .py file in the file browser: "Run as train job…".';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

export class GpusharePanel extends Widget {
  constructor(private readonly model: GpushareModel) {
    super();
    this.id = 'jupyter-gpushare-panel';
    this.addClass('jp-GpusharePanel');
    // The side bar shows the label, turned, under the icon (JupyterLab's sidebar tab labels).
    this.title.label = 'GPU';
    this.title.caption = 'GPU share: your build slice, quotas, queue and train jobs';
    const header = el('header', 'jp-GpusharePanel-header');
    header.append(el('h2', '', 'GPU share'), this._line);
    this._line.className = 'jp-GpusharePanel-line';
    this._table.className = 'jp-GpusharePanel-jobs';
    // Fixed column widths (style/base.css): the name's row spans them and ends in an ellipsis.
    const group = el('colgroup');
    for (const column of COLUMNS) {
      group.append(el('col', `jp-GpusharePanel-col${column}`));
    }
    this._table.prepend(group);
    const head = this._table.createTHead().insertRow();
    for (const column of COLUMNS) {
      head.append(el('th', '', column));
    }
    this._log.className = 'jp-GpusharePanel-log';
    this._logTitle.className = 'jp-GpusharePanel-logTitle';
    this._server.className = 'jp-GpusharePanel-server';
    this._rank.className = 'jp-GpusharePanel-rank jp-mod-styled';
    this._rank.title = 'The rank whose output to show';
    this._rank.hidden = true;
    this._rank.onchange = () => {
      const job = this._shown === null ? undefined : this.model.job(this._shown);
      if (job) {
        void this.showLogs(job, Number(this._rank.value));
      }
    };
    this.node.append(
      header,
      this._server,
      el('h3', '', 'Train quota'),
      this._quotas,
      el('h3', '', 'Your train jobs'),
      this._table,
      this._logTitle,
      this._rank,
      this._log
    );
    this._quotas.className = 'jp-GpusharePanel-quotas';
    this._logTitle.textContent = 'Logs: choose a job';
    model.changed.connect(this.update, this);
  }

  dispose(): void {
    this._following?.abort();
    super.dispose();
  }

  protected onAfterShow(): void {
    void this.model.refresh();
  }

  protected onUpdateRequest(): void {
    const { quota, error, updated, slice } = this.model;
    if (error !== null) {
      this._line.textContent = error;
    } else if (quota === null) {
      this._line.textContent = 'Asking the gpushare pool…';
    } else {
      const when = updated ? ago(updated) : '';
      let build = slice ? `this server holds ${gpuAmount(slice.gpus)} of a build GPU` : 'no build GPU slice';
      if (slice?.over) {
        build += ` (${slice.message || 'using more GPU memory than its slice'})`;
      }
      this._line.textContent = `${quota.user}: ${build}; updated ${when}`;
    }
    this.toggleClass('jp-mod-error', error !== null);
    this._renderServer();
    this._renderQuotas();
    this._renderJobs();
  }

  /** A usage line: sparkline, "SM 93% (1h 88%), 11 GiB", and the idle flag. */
  private _usage(usage: Usage | null | undefined, now: number): HTMLElement {
    const line = el('div', 'jp-GpusharePanel-usage');
    if (usage) {
      line.append(sparkSvg(minuteValues(usage.minutes, now)), el('span', 'jp-GpusharePanel-sparkLabel', 'last hour'));
    }
    line.append(el('span', 'jp-GpusharePanel-usageText', usageText(usage)));
    const idle = idleText(usage?.idle_for_s);
    if (idle) {
      line.append(el('span', 'jp-GpusharePanel-flag', idle));
    }
    return line;
  }

  // This server's slice as the pool sees it, and the warning before it is culled.
  private _renderServer(): void {
    const slice = this.model.slice;
    const now = Date.now() / 1000;
    this._server.replaceChildren();
    if (!slice || (!slice.usage && !slice.cull)) {
      return;
    }
    this._server.append(el('h3', '', `This server: ${gpuAmount(slice.gpus)} GPU slice`), this._usage(slice.usage, now));
    if (slice.cull) {
      const warning = el('div', 'jp-GpusharePanel-cull', cullWarning(slice.cull, now).sentence);
      warning.setAttribute('role', 'alert');
      warning.title = slice.cull.reason;
      this._server.append(warning);
    }
  }

  private _renderQuotas(): void {
    const projects = this.model.quota?.projects ?? [];
    const departments = this.model.quota?.departments ?? [];
    const scale = barScale([...projects, ...departments]);
    this._quotas.replaceChildren();
    if (this.model.quota && projects.length === 0) {
      this._quotas.append(el('p', '', 'You are in no project; ask an admin to add you to one.'));
    }
    for (const project of projects) {
      const name = project.department ? `${project.name} · ${project.department}` : project.name;
      this._quotaRow(quotaBar(project, scale), name, { project: project.name });
    }
    for (const department of departments) {
      this._quotaRow(departmentBar(department, scale), `department ${department.name}`, {
        department: department.name
      });
    }
  }

  private _quotaRow(bar: QuotaBar, name: string, data: Record<string, string>): void {
    const row = el('div', 'jp-GpusharePanel-quota');
    Object.assign(row.dataset, data);
    const track = el('div', 'jp-GpusharePanel-bar');
    track.title = bar.label;
    for (const [part, width] of [['used', bar.used], ['borrowed', bar.borrowed], ['free', bar.free]] as const) {
      const seg = el('span', `jp-GpusharePanel-${part}`);
      seg.style.width = `${width}%`;
      track.append(seg);
    }
    const mark = el('span', 'jp-GpusharePanel-quotaMark');
    mark.style.left = `${bar.quotaAt}%`;
    track.append(mark);
    row.append(el('div', 'jp-GpusharePanel-projectName', name), track, el('div', 'jp-GpusharePanel-label', bar.label));
    this._quotas.append(row);
  }

  // A side bar is narrow: each job is a group of three rows, its name across the width, its
  // fields in three columns, then why it waits and what can be done with it.
  private _renderJobs(): void {
    const now = Date.now() / 1000;
    while (this._table.tBodies.length) {
      this._table.tBodies[0].remove();
    }
    if (this.model.jobs.length === 0) {
      const cell = this._table.createTBody().insertRow().insertCell();
      cell.colSpan = COLUMNS.length;
      cell.className = 'jp-GpusharePanel-empty';
      cell.textContent = this.model.quota ? EMPTY : '';
    }
    for (const job of this.model.jobs) {
      const row = jobRow(job, now);
      const group = this._table.createTBody();
      group.dataset.job = job.id;
      group.dataset.state = job.state;
      group.classList.toggle('jp-mod-selected', job.id === this._shown);
      const name = el('div', 'jp-GpusharePanel-name', row.name);
      name.title = row.name === row.id ? row.id : `${row.name} (${row.id})`;
      const nameCell = group.insertRow().insertCell();
      nameCell.colSpan = COLUMNS.length;
      nameCell.append(name);
      const fields = group.insertRow();
      const state = fields.insertCell();
      state.append(el('div', 'jp-GpusharePanel-state', row.state));
      if (row.position) {
        state.append(el('div', 'jp-GpusharePanel-position', `${row.position} in queue`));
      }
      state.append(el('div', 'jp-GpusharePanel-attempt', `attempt ${row.attempt}`));
      fields.insertCell().append(el('span', 'jp-GpusharePanel-gpus', row.gpus));
      const time = el('span', 'jp-GpusharePanel-elapsed', row.elapsed);
      time.title = row.times;
      fields.insertCell().append(time);
      const detail = group.insertRow().insertCell();
      detail.colSpan = COLUMNS.length;
      if (job.state === 'running') {
        detail.append(this._usage(job.usage, now));
      }
      if (row.reason) {
        detail.append(el('div', 'jp-GpusharePanel-reason', row.reason));
      }
      if (row.lent) {
        detail.append(el('div', 'jp-GpusharePanel-lent', row.lent));
      }
      const logs = el('button', 'jp-GpusharePanel-button jp-GpusharePanel-logs', 'Logs');
      logs.disabled = !row.followable;
      logs.title = row.followable ? 'Show the output (followed while it runs)' : 'No output until it starts';
      logs.onclick = () => void this.showLogs(job);
      detail.append(logs);
      if (row.cancellable) {
        const cancel = el('button', 'jp-GpusharePanel-button jp-GpusharePanel-cancel', 'Cancel');
        cancel.title = job.state === 'running' ? 'Stop the job (it gets the grace period)' : 'Take it out of the queue';
        cancel.onclick = () => void this._cancel(job, cancel);
        detail.append(cancel);
      }
    }
  }

  private async _cancel(job: Job, button: HTMLButtonElement): Promise<void> {
    button.disabled = true;
    try {
      await this.model.api.cancel(job.id);
    } catch (error) {
      void showErrorMessage('Could not cancel the job', (error as Error).message);
    }
    void this.model.refresh();
  }

  /**
   * Show the output of one rank of a job (rank 0 unless chosen in the rank selector, which
   * a job with several ranks gets) and follow it while the job lives, attempt after attempt.
   */
  async showLogs(job: Job, rank = 0): Promise<void> {
    this._following?.abort();
    const control = new AbortController();
    this._following = control;
    this._shown = job.id;
    this._log.textContent = '';
    this._logTitle.textContent = `Logs: ${job.name || job.id}`;
    this._showRanks(job, rank);
    this.update();
    let attempt = job.attempt;
    for (;;) {
      const live = job.state === 'pending' || job.state === 'running';
      try {
        await this.model.api.logs(job.id, live, text => this._append(text), control.signal, rank);
      } catch (error) {
        if (control.signal.aborted) {
          return;
        }
        this._logTitle.textContent = `Logs: ${job.name || job.id}: ${(error as Error).message}`;
        return;
      }
      if (control.signal.aborted || !live) {
        break;
      }
      // The stream ends with the attempt: follow the next one if the job was requeued.
      await this.model.refresh().catch(() => undefined);
      const now = this.model.job(job.id);
      if (!now || now.attempt === attempt || !(now.state === 'pending' || now.state === 'running')) {
        break;
      }
      job = now;
      attempt = now.attempt;
      this._showRanks(job, rank);
      this._append(`\n--- attempt ${attempt} ---\n`);
    }
    if (!control.signal.aborted) {
      this._logTitle.textContent = `Logs: ${job.name || job.id} (ended)`;
    }
  }

  /** The rank selector: shown for a job of several ranks, on the rank being shown. */
  private _showRanks(job: Job, rank: number): void {
    const count = jobRow(job, 0).ranks;
    if (this._rank.options.length !== count) {
      this._rank.replaceChildren(
        ...Array.from({ length: count }, (_, r) => new Option(`rank ${r}`, String(r)))
      );
    }
    this._rank.value = String(Math.min(rank, count - 1));
    this._rank.hidden = count < 2;
  }

  private _append(text: string): void {
    const log = this._log;
    const atEnd = log.scrollHeight - log.scrollTop - log.clientHeight < 20;
    log.append(text);
    if (log.childNodes.length > 2000) {
      // A long run's output: keep the last 256 KiB in one text node, as a terminal would.
      log.textContent = (log.textContent ?? '').slice(-262144);
    }
    if (atEnd) {
      log.scrollTop = log.scrollHeight;
    }
  }

  private _line = el('div');
  private _server = el('div');
  private _quotas = el('div');
  private _table = el('table');
  private _logTitle = el('h3');
  private _log = el('pre');
  private _rank = el('select');
  private _shown: string | null = null;
  private _following: AbortController | null = null;
}
