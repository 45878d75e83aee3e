/**
 * The sidebar widget: renders ``RuntimeEnvModel`` (every env, its build, its workers) and
 * turns clicks into the model's actions. Plain DOM, re-rendered on each model change.
 */
import { Clipboard, Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { renderClusterKernels } from './clusterKernels';
import {
  IEnv,
  IEnvWorker,
  RuntimeEnvModel,
  failedStep,
  formatAge,
  formatBytes,
  specBrief,
  specToYaml
} from './model';

/** The installer output's tail of a build error: a list of lines or a text. */
function outputTail(tail: unknown): string {
  if (Array.isArray(tail)) {
    return tail.map(String).join('\n');
  }
  return tail ? String(tail) : '';
}

export interface IPanelOptions {
  model: RuntimeEnvModel;
  confirmDelete: () => boolean;
  /** A kernel as people know it (its notebook's path); default: its short id. */
  kernelLabel?: (kernelId: string) => string;
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function button(
  label: string,
  title: string,
  onClick: () => void,
  extra = ''
): HTMLButtonElement {
  const node = el('button', `jp-RuntimeEnv-button ${extra}`.trim(), label);
  node.title = title;
  node.type = 'button';
  node.addEventListener('click', event => {
    event.stopPropagation();
    onClick();
  });
  return node;
}

export class RuntimeEnvPanel extends Widget {
  constructor(options: IPanelOptions) {
    super();
    this._model = options.model;
    this._confirmDelete = options.confirmDelete;
    this.addClass('jp-RuntimeEnvPanel');
    this.id = 'jupyter-runtimeenv-panel';
    this.title.caption = 'Runtime environments';
    this._header = el('div', 'jp-RuntimeEnv-header');
    this._notice = el('div', 'jp-RuntimeEnv-notice');
    this._list = el('div', 'jp-RuntimeEnv-list');
    this._cluster = el('div', 'jp-RuntimeEnv-cluster');
    this._kernelLabel =
      options.kernelLabel ?? ((kernelId: string) => `kernel ${kernelId.slice(0, 8)}`);
    this.node.append(this._header, this._notice, this._cluster, this._list);
    this._disconnect = this._model.changed.connect(() => this._scheduleRender());
    this._ticker = setInterval(() => this.render(), 30000); // ages
    this.render();
  }

  dispose(): void {
    this._disconnect();
    clearInterval(this._ticker);
    super.dispose();
  }

  /** Render once per frame however many events arrive (a build's log is chatty). */
  private _scheduleRender(): void {
    if (this._frame !== null) {
      return;
    }
    this._frame = requestAnimationFrame(() => {
      this._frame = null;
      this.render();
    });
  }

  render(): void {
    const model = this._model;
    this._header.replaceChildren(
      el('span', 'jp-RuntimeEnv-title', 'Environments'),
      el(
        'span',
        `jp-RuntimeEnv-live ${model.connected ? 'jp-mod-live' : 'jp-mod-polling'}`,
        model.connected ? 'live' : 'polling'
      ),
      button('GC', 'Evict unreferenced environments (least recently used first)', () =>
        void this._gc()
      ),
      button('↻', 'Refresh', () => void model.refresh())
    );
    this._notice.textContent = model.error ?? this._message;
    this._notice.classList.toggle('jp-mod-error', !!model.error);
    this._cluster.replaceChildren(
      ...renderClusterKernels(model.clusterKernels.list(), this._kernelLabel, kernelId => {
        model.clusterKernels.dismiss(kernelId);
        this.render();
      })
    );
    const envs = model.sortedEnvs();
    if (!envs.length) {
      this._list.replaceChildren(
        el(
          'div',
          'jp-RuntimeEnv-empty',
          model.loaded
            ? 'No environments yet. Declare one in a notebook with %runtime_env.'
            : 'Loading…'
        )
      );
      return;
    }
    this._list.replaceChildren(...envs.map(env => this._card(env)));
  }

  private _card(env: IEnv): HTMLElement {
    const card = el('div', `jp-RuntimeEnv-card jp-mod-${env.state.toLowerCase()}`);
    card.dataset.envId = env.env_id;
    card.dataset.state = env.state;

    const top = el('div', 'jp-RuntimeEnv-row');
    const id = el('span', 'jp-RuntimeEnv-id', env.env_id.slice(0, 12));
    id.title = env.env_id;
    top.append(
      id,
      el('span', `jp-RuntimeEnv-state jp-mod-${env.state.toLowerCase()}`, env.state)
    );
    if (env.size !== null && env.size !== undefined) {
      top.append(el('span', 'jp-RuntimeEnv-meta', formatBytes(env.size)));
    }
    const age = el(
      'span',
      'jp-RuntimeEnv-meta',
      `used ${formatAge(env.last_used ?? env.created)} ago`
    );
    age.title = `created ${formatAge(env.created)} ago`;
    top.append(age);
    card.append(top);

    card.append(el('div', 'jp-RuntimeEnv-brief', specBrief(env.spec, env.fields)));

    if (env.holders.length) {
      const holders = el('div', 'jp-RuntimeEnv-holders');
      holders.append(el('span', 'jp-RuntimeEnv-label', 'held by '));
      holders.append(
        document.createTextNode(env.holders.map(h => h.label).join(', '))
      );
      holders.title = env.holders.map(h => h.id).join('\n');
      card.append(holders);
    }

    const building = env.state === 'BUILDING' || env.state === 'PENDING';
    if (building || env.state === 'FAILED') {
      card.append(this._steps(env));
    }
    if (env.state === 'FAILED') {
      const step = failedStep(env);
      card.append(
        el(
          'div',
          'jp-RuntimeEnv-error',
          `failed${step ? ` at step ${step}` : ''}: ${env.error?.message ?? 'unknown error'}`
        )
      );
      const tail = outputTail(env.error?.output_tail) || env.log.join('\n');
      if (tail) {
        card.append(el('pre', 'jp-RuntimeEnv-log', tail.split('\n').slice(-15).join('\n')));
      }
    } else if (building && env.log.length) {
      card.append(el('pre', 'jp-RuntimeEnv-log', env.log.slice(-8).join('\n')));
    }

    const workers = this._model.workersOf(env.env_id);
    if (workers.length) {
      card.append(this._workers(workers));
    }

    const actions = el('div', 'jp-RuntimeEnv-actions');
    actions.append(
      button('Rebuild', 'Build this environment again', () => void this._rebuild(env)),
      button('Release', 'Drop the reference taken through the REST API', () =>
        void this._act(() => this._model.release(env.env_id))
      ),
      button('Delete', 'Remove this environment from the cache', () => void this._delete(env), 'jp-mod-warn'),
      button('Copy', 'Copy the spec as YAML', () =>
        void this._act(async () => {
          Clipboard.copyToSystem(specToYaml(await this._model.specOf(env.env_id)));
          this._say('spec copied as YAML');
        })
      )
    );
    card.append(actions);
    return card;
  }

  private _steps(env: IEnv): HTMLElement {
    const list = el('ul', 'jp-RuntimeEnv-steps');
    for (const [name, step] of Object.entries(env.steps)) {
      const item = el('li', `jp-RuntimeEnv-step jp-mod-${step.status ?? 'running'}`);
      item.append(
        el('span', 'jp-RuntimeEnv-stepStatus', step.status ?? 'running'),
        el('span', 'jp-RuntimeEnv-stepName', name)
      );
      item.title = name;
      list.append(item);
    }
    return list;
  }

  private _workers(workers: IEnvWorker[]): HTMLElement {
    const box = el('div', 'jp-RuntimeEnv-workers');
    box.append(el('div', 'jp-RuntimeEnv-label', `workers (${workers.length})`));
    for (const worker of workers) {
      const row = el('div', 'jp-RuntimeEnv-worker');
      row.dataset.pid = String(worker.pid);
      const line = el('div', 'jp-RuntimeEnv-row');
      line.append(
        el('span', 'jp-RuntimeEnv-workerWho', `pid ${worker.pid}`),
        el(
          'span',
          `jp-RuntimeEnv-workerState ${worker.busy ? 'jp-mod-busy' : 'jp-mod-idle'}`,
          worker.busy ? 'busy' : 'idle'
        ),
        button('Stop', `Stop worker ${worker.pid} of ${worker.kernel_label}`, () =>
          void this._act(() => this._model.stopWorker(worker.kernel_id, worker.pid))
        )
      );
      const failed = worker.tasks_failed ? ` · ${worker.tasks_failed} failed` : '';
      const detail = el(
        'div',
        'jp-RuntimeEnv-workerOf',
        `${worker.tasks_done} done${failed} · ${formatBytes(worker.rss)} · ${worker.kernel_label}`
      );
      detail.title = worker.kernel_label;
      row.append(line, detail);
      box.append(row);
    }
    return box;
  }

  private async _rebuild(env: IEnv): Promise<void> {
    const held = env.state === 'READY' && env.holders.length > 0;
    if (held) {
      const answer = await showDialog({
        title: 'Rebuild a held environment?',
        body: `${env.env_id.slice(0, 12)} is held by ${env.holders.map(h => h.label).join(', ')}. Their running workers keep the old files until they stop.`,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Rebuild' })]
      });
      if (!answer.button.accept) {
        return;
      }
    }
    await this._act(() => this._model.rebuild(env.env_id, held));
  }

  private async _delete(env: IEnv): Promise<void> {
    const held = env.holders.length > 0;
    if (held && this._confirmDelete()) {
      const answer = await showDialog({
        title: 'Delete a held environment?',
        body: `${env.env_id.slice(0, 12)} is held by ${env.holders.map(h => h.label).join(', ')}.`,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
      });
      if (!answer.button.accept) {
        return;
      }
    }
    await this._act(async () => {
      const removed = await this._model.remove(env.env_id, held);
      this._say(`deleted ${env.env_id.slice(0, 12)} (${removed.length} resources freed)`);
    });
  }

  private async _gc(): Promise<void> {
    await this._act(async () => {
      const freed = await this._model.gc();
      this._say(`GC freed ${formatBytes(freed)}`);
    });
  }

  private async _act(action: () => Promise<unknown>): Promise<void> {
    try {
      await action();
    } catch (reason) {
      await showErrorMessage('Runtime environments', reason as Error);
    }
  }

  private _say(text: string): void {
    this._message = text;
    this.render();
  }

  private _model: RuntimeEnvModel;
  private _confirmDelete: () => boolean;
  private _header: HTMLElement;
  private _notice: HTMLElement;
  private _list: HTMLElement;
  private _cluster: HTMLElement;
  private _kernelLabel: (kernelId: string) => string;
  private _message = '';
  private _disconnect: () => void;
  private _ticker: ReturnType<typeof setInterval>;
  private _frame: number | null = null;
}
