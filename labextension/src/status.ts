/**
 * The status bar item: "GPU ¼ · vision 4/2 · 1 queued", and "⚠ idle: stops in 8 min" while
 * this server is warned that it will be culled; a click opens the panel.
 */
import { Widget } from '@lumino/widgets';

import { statusText, statusTitle } from './model';
import { GpushareModel } from './poller';

export class GpushareStatus extends Widget {
  constructor(
    private readonly model: GpushareModel,
    onClick: () => void
  ) {
    super({ node: document.createElement('div') });
    this.addClass('jp-GpushareStatus');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', onClick);
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        onClick();
      }
    });
    model.changed.connect(this.update, this);
    this.update();
  }

  protected onUpdateRequest(): void {
    const { slice, quota, error } = this.model;
    this.node.textContent = statusText(slice, quota, error);
    this.node.title = statusTitle(slice, quota, error);
    this.toggleClass('jp-mod-error', error !== null || (slice?.over ?? false) || Boolean(slice?.cull));
  }
}
