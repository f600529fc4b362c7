/**
 * jupyter-gpushare in JupyterLab: the wiring. A status bar item, a side panel and the file
 * browser's "Run as train job…" for .py files, all over one poller of the server extension.
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { FileBrowser, IDefaultFileBrowser, IFileBrowserFactory } from '@jupyterlab/filebrowser';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { GpushareAPI } from './api';
import { runAsTrainJob } from './dialog';
import { GpusharePanel } from './panel';
import { GpushareModel } from './poller';
import { GpushareStatus } from './status';

const OPEN = 'gpushare:open-panel';
const RUN = 'gpushare:run-as-train-job';

const gpuIcon = new LabIcon({
  name: 'jupyter-gpushare:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M3 7h15a2 2 0 0 1 2 2v6a2 2 0 0 1-2 2H6v2H4V9H3zm4 3v4h4v-4zm6 0v4h4v-4zM21 10h1v4h-1z"/>' +
    '</g></svg>'
});

/** The Python that runs scripts: the default Python kernel's, as the notebook's own jobs do. */
function kernelPython(app: JupyterFrontEnd): string {
  const specs = app.serviceManager.kernelspecs.specs;
  const spec = specs?.kernelspecs[specs.default];
  const argv0 = spec?.argv?.[0];
  return spec?.language === 'python' && argv0 && argv0.startsWith('/') ? argv0 : 'python3';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpushare:plugin',
  description: 'GPU slice and train usage in the status bar; quotas, queue and jobs in a side panel.',
  autoStart: true,
  requires: [IFileBrowserFactory],
  optional: [ILabShell, IStatusBar, ICommandPalette, IDefaultFileBrowser],
  activate: (
    app: JupyterFrontEnd,
    factory: IFileBrowserFactory,
    labShell: ILabShell | null,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    defaultBrowser: FileBrowser | null
  ) => {
    const api = new GpushareAPI(app.serviceManager.serverSettings);
    const model = new GpushareModel(api);
    const panel = new GpusharePanel(model);
    panel.title.icon = gpuIcon;
    if (labShell) {
      labShell.add(panel, 'right', { rank: 600 });
    }

    app.commands.addCommand(OPEN, {
      label: 'GPU share: quotas, queue and jobs',
      icon: gpuIcon,
      execute: () => app.shell.activateById(panel.id)
    });

    app.commands.addCommand(RUN, {
      label: 'Run as train job…',
      icon: gpuIcon,
      isVisible: () => selectedPath(factory, defaultBrowser)?.endsWith('.py') ?? false,
      execute: async () => {
        const path = selectedPath(factory, defaultBrowser);
        if (!path) {
          return;
        }
        await app.serviceManager.kernelspecs.ready;
        const job = await runAsTrainJob(api, {
          path,
          serverRoot: PageConfig.getOption('serverRoot'),
          python: kernelPython(app)
        });
        if (job) {
          app.shell.activateById(panel.id);
          await model.refresh();
          const shown = model.job(job.id) ?? job;
          void panel.showLogs(shown);
        }
      }
    });

    app.contextMenu.addItem({
      command: RUN,
      selector: '.jp-DirListing-item[data-file-type="python"]',
      rank: 3
    });
    palette?.addItem({ command: OPEN, category: 'GPU share' });

    if (statusBar) {
      statusBar.registerStatusItem('jupyter-gpushare:status', {
        item: new GpushareStatus(model, () => void app.commands.execute(OPEN)),
        align: 'left',
        rank: 50
      });
    }
  }
};

function selectedPath(factory: IFileBrowserFactory, fallback: FileBrowser | null): string | undefined {
  const browser = factory.tracker.currentWidget ?? fallback;
  const first = browser?.selectedItems().next();
  return first && !first.done ? first.value.path : undefined;
}

export default plugin;
