/**
 * The one place that knows the server extension's REST paths (`/gpushare/api/...` in this
 * notebook server). ServerConnection adds the XSRF token and the server's auth; the browser
 * never holds the hub token: the server extension forwards to the pool with its own.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import {
  BuildSlice,
  Job,
  Quota,
  RetryOptions,
  TrainSpec,
  buildSlice,
  errorMessage,
  newRequestId,
  retrying
} from './model';

/** A request the server or the pool refused or could not answer: `message` is one sentence. */
export class GpushareError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
  }

  /** The pool (or this server) cannot be reached, as opposed to refusing the request. */
  get unreachable(): boolean {
    return this.status === 0 || this.status >= 502;
  }
}

export class GpushareAPI {
  constructor(readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  /** `retry`: keep trying while the pool cannot be reached (the poll backs off instead). */
  quota(retry?: RetryOptions): Promise<Quota> {
    return this.json('quota', {}, retry);
  }

  async jobs(): Promise<Job[]> {
    return (await this.json<{ jobs: Job[] }>('jobs?limit=50')).jobs;
  }

  pool(retry?: RetryOptions): Promise<{ capacity: number; simulated: boolean }> {
    return this.json('pool', {}, retry);
  }

  /** This server's build slice, or null when it holds none. */
  async slice(): Promise<BuildSlice | null> {
    return buildSlice(await this.json<unknown>('slice'));
  }

  /**
   * Submit a train job with `requestId` as its Idempotency-Key. Tried again while the pool
   * cannot be reached: a try that reached it before a crash gets the same job back, never a
   * second one.
   */
  submit(spec: TrainSpec, requestId: string = newRequestId(), retry: RetryOptions = {}): Promise<Job> {
    const init = { method: 'POST', body: JSON.stringify(spec), headers: { 'Idempotency-Key': requestId } };
    return this.json('jobs', init, retry);
  }

  cancel(id: string): Promise<Job> {
    return this.json(`jobs/${encodeURIComponent(id)}`, { method: 'DELETE' });
  }

  /**
   * The output of one rank of the job (0 by default), passed to `onText` as it arrives; with
   * `follow` until the attempt ends. Resolves when the stream ends; `signal` stops it.
   */
  async logs(
    id: string,
    follow: boolean,
    onText: (text: string) => void,
    signal?: AbortSignal,
    rank = 0
  ): Promise<void> {
    const query = new URLSearchParams();
    if (follow) {
      query.set('follow', '1');
    }
    if (rank) {
      query.set('rank', String(rank));
    }
    const search = query.toString();
    const path = `jobs/${encodeURIComponent(id)}/logs${search ? `?${search}` : ''}`;
    const response = await this.request(path, { signal });
    const reader = response.body?.getReader();
    if (!reader) {
      onText(await response.text());
      return;
    }
    const decoder = new TextDecoder();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        break;
      }
      onText(decoder.decode(value, { stream: true }));
    }
    onText(decoder.decode());
  }

  private async json<T>(path: string, init: RequestInit = {}, retry?: RetryOptions): Promise<T> {
    const once = async () => (await (await this.request(path, init)).json()) as T;
    if (!retry) {
      return once();
    }
    return retrying(once, error => error instanceof GpushareError && error.unreachable, retry);
  }

  private async request(path: string, init: RequestInit): Promise<Response> {
    const url = URLExt.join(this.settings.baseUrl, 'gpushare', 'api', path);
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.settings);
    } catch (error) {
      if (init.signal?.aborted) {
        throw error;
      }
      throw new GpushareError('This notebook server cannot be reached.', 0);
    }
    if (!response.ok) {
      throw new GpushareError(errorMessage(response.status, await response.text()), response.status);
    }
    return response;
  }
}
