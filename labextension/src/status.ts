/**
 * The status bar item: "GPU ¼ · vision 4/2 · 1 queued", and "⚠ idle: stops in 8m 00s" while
 * this server is warned that it will be culled; a click opens the panel. It is built of
 * JupyterLab's own status bar classes (a highlighted group item with a text item), so it sits
 * on the line of its neighbours; hovering or focusing it shows a card with the same, spelled
 * out (JupyterLab's status bar offers no tooltip of its own beyond `title`).
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
    this.addClass('jp-StatusBar-GroupItem');
    this.addClass('jp-mod-highlighted');
    this._text.className = 'jp-StatusBar-TextItem';
    this.node.append(this._text);
    this.node.setAttribute('role', 'button');
    this.node.setAttribute('aria-describedby', CARD_ID);
    this.node.tabIndex = 0;
    this._card.id = CARD_ID;
    this._card.className = 'jp-GpushareStatus-card jp-StatusBar-HoverItem';
    this._card.setAttribute('role', 'tooltip');
    this._card.hidden = true;
    this.node.addEventListener('click', () => {
      this._hide();
      onClick();
    });
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        onClick();
      } else if (event.key === 'Escape') {
        this._hide();
      }
    });
    for (const [name, handler] of [
      ['mouseenter', this._show],
      ['focus', this._show],
      ['mouseleave', this._hide],
      ['blur', this._hide]
    ] as const) {
      this.node.addEventListener(name, handler);
    }
    model.changed.connect(this.update, this);
    this.update();
  }

  dispose(): void {
    this._card.remove();
    super.dispose();
  }

  protected onUpdateRequest(): void {
    const { slice, quota, error } = this.model;
    this._text.textContent = statusText(slice, quota, error);
    this._card.replaceChildren(
      ...statusTitle(slice, quota, error)
        .split('\n')
        .map(line => {
          const p = document.createElement('p');
          p.textContent = line;
          return p;
        })
    );
    this.toggleClass('jp-mod-error', error !== null || (slice?.over ?? false) || Boolean(slice?.cull));
  }

  // The card lives in the page's body, above the status bar (which clips what overflows it).
  private _show = (): void => {
    if (!this._card.isConnected) {
      document.body.append(this._card);
    }
    this._card.hidden = false;
    const item = this.node.getBoundingClientRect();
    const width = this._card.offsetWidth;
    this._card.style.left = `${Math.max(4, Math.min(item.left, window.innerWidth - width - 4))}px`;
    this._card.style.bottom = `${window.innerHeight - item.top + 4}px`;
  };

  private _hide = (): void => {
    this._card.hidden = true;
  };

  private _text = document.createElement('span');
  private _card = document.createElement('div');
}

const CARD_ID = 'jupyter-gpushare-status-card';
