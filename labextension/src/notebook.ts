/**
 * Notebooks that carry their environment: ``metadata.runtime_env`` (see the README).
 *
 * ``saveEnvToNotebook`` asks the server for the env the notebook's kernel declared (the
 * kernel reports it), with paths relative to the notebook, and writes it into the metadata.
 * ``NotebookEnvBadge`` sits in the toolbar of a notebook with such metadata: it shows the
 * state of that env on this server (cached, building, failed, missing) and a button that
 * declares it in the kernel, by running ``notebook_meta.declare`` there (the same as
 * ``%runtime_env --file``: built at once, the kernel's next tasks use it), each env pinned to
 * the versions of the lock saved with it; "Upgrade" declares them resolved anew instead. The
 * badge says when the envs the kernel runs differ from the notebook's lock.
 */
import { Notification, showErrorMessage } from '@jupyterlab/apputils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { INotebookEnvStatus, ITransport, RuntimeEnvModel, isNotebookEnv } from './model';
import { badgeText, badgeTitle, declareCode, hasLock } from './notebookEnv';

export const METADATA_KEY = 'runtime_env';

export async function saveEnvToNotebook(
  transport: ITransport,
  panel: NotebookPanel
): Promise<Record<string, unknown>> {
  const kernel = panel.sessionContext.session?.kernel;
  if (!kernel) {
    throw new Error('this notebook has no running kernel');
  }
  const path = encodeURIComponent(panel.context.path);
  const meta = await transport.request<Record<string, unknown>>(
    'GET',
    `kernels/${kernel.id}/notebook_env?path=${path}`
  );
  const unlocked = takeLockErrors(meta);
  const value = { ...meta, saved: new Date().toISOString() };
  panel.model!.setMetadata(METADATA_KEY, value);
  await panel.context.save();
  const names = savedNames(value);
  const locked = names.filter(([, entry]) => !!entry.lock).map(([name]) => name);
  Notification.success(
    `Saved ${names.map(([name]) => name).join(', ')} to ${panel.context.path}` +
      (locked.length ? ` (versions locked: ${locked.join(', ')})` : ''),
    { autoClose: 5000 }
  );
  if (unlocked.length) {
    Notification.warning(
      `Saved without a lock (its versions are resolved again where it is declared): ${unlocked.join('; ')}`,
      { autoClose: false }
    );
  }
  return value;
}

/** The envs of saved metadata by the names users know: ``(default)`` first. */
function savedNames(meta: Record<string, unknown>): [string, Record<string, unknown>][] {
  const out: [string, Record<string, unknown>][] = [];
  if (meta.spec) {
    out.push(['(default)', meta]);
  }
  for (const [name, entry] of Object.entries((meta.named ?? {}) as object)) {
    out.push([name, entry as Record<string, unknown>]);
  }
  return out;
}

/** Remove the server's ``lock_error`` notes from ``meta`` (they are not saved); each as
 * ``name: reason``. */
function takeLockErrors(meta: Record<string, unknown>): string[] {
  const found: string[] = [];
  for (const [name, entry] of savedNames(meta)) {
    if (typeof entry.lock_error === 'string') {
      found.push(`${name}: ${entry.lock_error}`);
    }
    delete entry.lock_error;
  }
  return found;
}

export class NotebookEnvBadge extends Widget {
  constructor(
    readonly panel: NotebookPanel,
    readonly transport: ITransport,
    model: RuntimeEnvModel
  ) {
    super();
    this.addClass('jp-RuntimeEnv-badge');
    this._label = document.createElement('span');
    this._label.className = 'jp-RuntimeEnv-badgeLabel';
    this._button = document.createElement('button');
    this._button.className = 'jp-RuntimeEnv-button';
    this._button.type = 'button';
    this._button.textContent = 'Declare';
    this._button.title = "Declare this notebook's environment in its kernel";
    this._button.addEventListener('click', () => void this.declare());
    this._upgrade = document.createElement('button');
    this._upgrade.className = 'jp-RuntimeEnv-button jp-RuntimeEnv-upgrade';
    this._upgrade.type = 'button';
    this._upgrade.textContent = 'Upgrade';
    this._upgrade.title =
      "Declare this notebook's environment resolved anew: the newest versions its " +
      "requirements allow, not the versions of the notebook's lock";
    this._upgrade.addEventListener('click', () => void this.declare(true));
    this.node.append(this._label, this._button, this._upgrade);
    this._disconnect = model.changed.connect(() => this._scheduleUpdate());
    panel.context.ready.then(() => {
      panel.model?.metadataChanged.connect(() => this._scheduleUpdate());
      this._scheduleUpdate();
    });
    this.hide();
  }

  dispose(): void {
    this._disconnect();
    super.dispose();
  }

  get metadata(): unknown {
    return this.panel.model?.getMetadata(METADATA_KEY);
  }

  async update_(): Promise<void> {
    const meta = this.metadata;
    if (!isNotebookEnv(meta)) {
      this.hide();
      return;
    }
    this._upgrade.hidden = !hasLock(meta);
    let status: INotebookEnvStatus;
    try {
      status = await this.transport.request<INotebookEnvStatus>(
        'POST',
        'notebook_env',
        {
          path: this.panel.context.path,
          runtime_env: meta,
          // The envs this kernel runs are the ones compared with the notebook's lock.
          kernel_id: this.panel.sessionContext.session?.kernel?.id ?? null
        }
      );
    } catch (reason) {
      status = { state: 'unknown' };
      this.node.title = String((reason as Error).message ?? reason);
    }
    this.node.dataset.state = status.state;
    this._label.className = `jp-RuntimeEnv-badgeLabel jp-mod-${status.state}`;
    this.node.dataset.lock = status.lock_differences?.length ? 'differs' : 'ok';
    this._label.textContent = badgeText(status);
    if (status.state !== 'unknown') {
      this.node.title = badgeTitle(status);
    }
    this.show();
  }

  async declare(upgrade = false): Promise<void> {
    const meta = this.metadata;
    const kernel = this.panel.sessionContext.session?.kernel;
    if (!isNotebookEnv(meta) || !kernel) {
      return;
    }
    this._label.textContent = upgrade ? 'env: upgrading…' : 'env: declaring…';
    const future = kernel.requestExecute({
      code: declareCode(meta, upgrade),
      silent: false,
      store_history: false
    });
    const reply = await future.done;
    this._scheduleUpdate();
    const content = reply.content;
    if (content.status === 'error') {
      await showErrorMessage(
        "Declare the notebook's environment",
        `${content.ename}: ${content.evalue}`
      );
    }
  }

  private _scheduleUpdate(): void {
    if (this._timer !== null) {
      return;
    }
    this._timer = setTimeout(() => {
      this._timer = null;
      void this.update_();
    }, 200);
  }

  private _label: HTMLElement;
  private _button: HTMLButtonElement;
  private _upgrade: HTMLButtonElement;
  private _disconnect: () => void;
  private _timer: ReturnType<typeof setTimeout> | null = null;
}
