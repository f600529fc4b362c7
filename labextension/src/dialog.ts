/**
 * "Run as train job…": a dialog asks how many GPUs and which project, checks the answer
 * next to the fields (Submit stays disabled while it is wrong), and submits the script as a
 * train job in the script's folder. A refusal from the pool (over the project's limit, say)
 * opens the dialog again with the pool's sentence.
 */
import { Dialog, Notification, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { GpushareAPI, GpushareError } from './api';
import {
  Job,
  RetryOptions,
  TrainForm,
  TrainLimits,
  TrainTarget,
  gpuAmount,
  newRequestId,
  trainSpec
} from './model';

class TrainJobBody extends Widget implements Dialog.IBodyWidget<TrainForm> {
  constructor(
    form: TrainForm,
    private readonly limits: TrainLimits,
    private readonly target: TrainTarget,
    refusal: string
  ) {
    super();
    this.addClass('jp-GpushareDialog');
    this._gpus.type = 'number';
    this._gpus.min = '1';
    this._gpus.step = '1';
    this._gpus.value = form.gpus;
    this._gpus.name = 'gpus';
    this._name.value = form.name;
    this._name.name = 'name';
    this._name.maxLength = 100;
    this._project.name = 'project';
    if (limits.projects.length !== 1) {
      this._project.append(new Option(limits.projects.length ? 'choose a project' : 'none', ''));
    }
    for (const p of limits.projects) {
      const free = Math.max(0, p.quota - p.in_use);
      this._project.append(
        new Option(`${p.name} (${gpuAmount(free)} of ${gpuAmount(p.quota)} guaranteed free)`, p.name)
      );
    }
    this._project.value = form.project || (limits.projects.length === 1 ? limits.projects[0].name : '');
    this._perGpu.type = 'checkbox';
    this._perGpu.name = 'per_gpu';
    this._perGpu.checked = form.perGpu === true;
    for (const node of [this._gpus, this._project, this._name]) {
      node.classList.add('jp-mod-styled');
    }
    const field = (label: string, input: HTMLElement): HTMLLabelElement => {
      const node = document.createElement('label');
      node.append(label, input);
      return node;
    };
    const capacity = limits.capacity === null ? '' : ` (the pool has ${gpuAmount(limits.capacity)})`;
    const runs = document.createElement('p');
    runs.className = 'jp-GpushareDialog-command';
    runs.textContent = `Runs ${target.python} ${target.path.split('/').pop()} in its folder.`;
    this._error.className = 'jp-GpushareDialog-error';
    this._error.setAttribute('role', 'alert');
    const perGpu = document.createElement('label');
    perGpu.className = 'jp-GpushareDialog-perGpu';
    perGpu.title =
      'Without it, one process per node runs (start your own workers, e.g. with torchrun); ' +
      'with it, one process per GPU, each with its RANK and LOCAL_RANK.';
    perGpu.append(this._perGpu, ' One process per GPU');
    this.node.append(
      field(`GPUs${capacity}`, this._gpus),
      field('Project', this._project),
      field('Name', this._name),
      perGpu,
      runs,
      this._error
    );
    this._refusal = refusal;
    this._check();
  }

  getValue(): TrainForm {
    return {
      gpus: this._gpus.value,
      project: this._project.value,
      name: this._name.value,
      perGpu: this._perGpu.checked
    };
  }

  // Registered before the dialog's own listener, so its check sees this one's verdict.
  protected onAfterAttach(): void {
    document.addEventListener('input', this._onInput, true);
    this._gpus.focus();
    this._gpus.select();
  }

  protected onBeforeDetach(): void {
    document.removeEventListener('input', this._onInput, true);
  }

  private _onInput = (): void => {
    this._refusal = '';
    this._check();
  };

  private _check(): void {
    const checked = trainSpec(this.getValue(), this.limits, this.target);
    const error = 'error' in checked ? checked.error : this._refusal;
    this._error.textContent = error;
    this._error.classList.toggle('jp-mod-error', 'error' in checked);
  }

  private _gpus = document.createElement('input');
  private _project = document.createElement('select');
  private _name = document.createElement('input');
  private _perGpu = document.createElement('input');
  private _error = document.createElement('p');
  private _refusal: string;
}

/** Ask, check, submit; resolves to the job, or null when the user gave up. */
export async function runAsTrainJob(api: GpushareAPI, target: TrainTarget): Promise<Job | null> {
  // While the pool restarts (seconds), reads and the submit are tried again, said in one line.
  const retry: RetryOptions = { onRetry: text => Notification.info(text, { autoClose: 5000 }) };
  let limits: TrainLimits;
  try {
    const [quota, pool] = await Promise.all([api.quota(retry), api.pool(retry)]);
    limits = { projects: quota.projects, capacity: pool.capacity };
  } catch (error) {
    await showErrorMessage('Cannot run a train job now', (error as Error).message);
    return null;
  }
  let form: TrainForm = { gpus: '1', project: '', name: target.path.split('/').pop() ?? '' };
  let refusal = '';
  for (;;) {
    const result = await showDialog({
      title: 'Run as train job',
      body: new TrainJobBody(form, limits, target, refusal),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Submit' })],
      focusNodeSelector: 'input'
    });
    if (!result.button.accept || result.value === null) {
      return null;
    }
    form = result.value;
    const checked = trainSpec(form, limits, target);
    if ('error' in checked) {
      refusal = checked.error; // pressed Enter past the check: say it again
      continue;
    }
    try {
      const job = await api.submit(checked.spec, newRequestId(), retry);
      Notification.success(`Train job ${job.name || job.id} submitted: ${job.state}.`, { autoClose: 5000 });
      return job;
    } catch (error) {
      if (error instanceof GpushareError && !error.unreachable) {
        refusal = error.message;
        continue;
      }
      await showErrorMessage('The train job was not submitted', (error as Error).message);
      return null;
    }
  }
}
