/**
 * jupyter-runtimeenv's JupyterLab extension: wiring only. The sidebar (``panel.tsx``) renders
 * the model (``model.ts``), fed by the REST API and the event stream (``api.ts``); a build log
 * opens in a tab (``logview.tsx``); notebooks get a toolbar badge for the env they carry
 * (``notebook.ts``) and keep finished widgets readable (``outputs.ts``).
 */
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';
import { DocumentRegistry } from '@jupyterlab/docregistry';

import iconSvg from '../style/icon.svg';
import { ServerTransport } from './api';
import { RuntimeEnvModel } from './model';
import { NotebookEnvBadge, saveEnvToNotebook } from './notebook';
import { followFinalUpdates } from './outputs';
import { createLogWidget } from './logview';
import { RuntimeEnvPanel } from './panel';

const PLUGIN_ID = 'jupyter-runtimeenv:plugin';

namespace CommandIDs {
  export const open = 'runtimeenv:open-panel';
  export const refresh = 'runtimeenv:refresh';
  export const save = 'runtimeenv:save-to-notebook';
  export const viewLog = 'runtimeenv:view-log';
}

export const runtimeEnvIcon = new LabIcon({
  name: 'jupyter-runtimeenv:icon',
  svgstr: iconSvg
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Runtime environments: a sidebar and notebooks that carry their env.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILayoutRestorer, ISettingRegistry, ILabShell],
  activate: async (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null,
    labShell: ILabShell | null
  ) => {
    const transport = new ServerTransport(app.serviceManager.serverSettings);
    const model = new RuntimeEnvModel({ transport });
    let confirmDelete = true;

    // A kernel as people know it: the path of the notebook (or console) it serves.
    const kernelLabel = (kernelId: string): string => {
      for (const session of app.serviceManager.sessions.running()) {
        if (session.kernel?.id === kernelId) {
          return session.path;
        }
      }
      return `kernel ${kernelId.slice(0, 8)}`;
    };
    const openLog = (envId: string) =>
      void app.commands.execute(CommandIDs.viewLog, { env_id: envId });
    const panel = new RuntimeEnvPanel({
      model,
      confirmDelete: () => confirmDelete,
      openLog,
      kernelLabel
    });
    panel.title.icon = runtimeEnvIcon;
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, 'jupyter-runtimeenv-panel');

    if (settingRegistry) {
      try {
        const settings = await settingRegistry.load(PLUGIN_ID);
        const apply = () => {
          model.pollInterval = settings.get('pollInterval').composite as number;
          confirmDelete = settings.get('confirmDelete').composite as boolean;
        };
        apply();
        settings.changed.connect(apply);
      } catch (reason) {
        console.warn('jupyter-runtimeenv: settings not loaded', reason);
      }
    }
    void model.start();
    // Holders are named by notebook path: a rename, a new or a closed session renames them.
    app.serviceManager.sessions.runningChanged.connect(() => void model.refresh());

    app.commands.addCommand(CommandIDs.open, {
      label: 'Show Runtime Environments',
      icon: runtimeEnvIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    const logs = new Map<string, MainAreaWidget>();
    app.commands.addCommand(CommandIDs.viewLog, {
      label: args => `Build Log of ${String(args.env_id ?? '').slice(0, 12)}`,
      describedBy: {
        args: {
          type: 'object',
          properties: { env_id: { type: 'string', description: 'the env id' } }
        }
      },
      execute: args => {
        const envId = String(args.env_id ?? '');
        if (!/^[0-9a-f]{64}$/.test(envId)) {
          return;
        }
        let widget = logs.get(envId);
        if (!widget || widget.isDisposed) {
          widget = createLogWidget(model, envId);
          logs.set(envId, widget);
          widget.disposed.connect(() => logs.delete(envId));
          if (labShell) {
            app.shell.add(widget, 'main', { mode: 'split-right' });
          } else {
            // Notebook 7's page holds one main widget (it ignores a second): the log
            // opens as the page's right side panel, next to the notebook.
            widget.title.caption = widget.title.label;
            app.shell.add(widget, 'right', { rank: 1000 });
          }
        }
        app.shell.activateById(widget.id);
      }
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh Runtime Environments',
      execute: () => model.refresh()
    });
    app.commands.addCommand(CommandIDs.save, {
      label: 'Save Environment to Notebook',
      isEnabled: () => !!notebooks.currentWidget,
      execute: async () => {
        const current = notebooks.currentWidget;
        if (!current) {
          return;
        }
        try {
          await saveEnvToNotebook(transport, current);
        } catch (reason) {
          await showErrorMessage('Save environment to notebook', reason as Error);
        }
      }
    });
    // Notebook 7 (no ILabShell) lists 'Show <caption>' for every side panel itself: a second
    // entry of ours would list the panel twice.
    const listed = labShell ? [CommandIDs.open] : [];
    for (const command of [...listed, CommandIDs.refresh, CommandIDs.save]) {
      palette?.addItem({ command, category: 'Runtime Environments' });
    }

    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (nb: NotebookPanel, _context: DocumentRegistry.IContext<any>) => {
        followFinalUpdates(nb, transport);
        const badge = new NotebookEnvBadge(nb, transport, model);
        nb.toolbar.insertItem(10, 'runtimeEnv', badge);
        return badge;
      }
    });
  }
};

export default plugin;
