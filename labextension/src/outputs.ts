/**
 * Finished widgets that stay readable without a kernel (``ipython/static.py``).
 *
 * When a build or a progress bar ends, the kernel replaces its widget output by static
 * ``text/html`` + ``text/plain`` (``update_display_data``), and names in the update's
 * metadata the widget models it replaces. JupyterLab applies an update only while the cell
 * area that displayed the output, while that area lives; a background build may end after
 * the notebook was closed and reopened. So for every notebook we watch the kernel's iopub
 * messages and swap, in any cell, an output that shows one of the named models for the
 * static one (what the saved notebook then keeps), and when the notebook connects to its
 * kernel we ask the kernel for the static forms of the widgets it shows that finished
 * meanwhile (``final_bundles``, a silent ``user_expressions`` request that imports nothing:
 * it answers only in a kernel that loaded the extension).
 *
 * A build widget still live when its kernel restarts or dies never gets its static form (the
 * kernel that would send it is gone) and would say BUILDING for ever: its display's metadata
 * names the env it builds (``{"jupyter_runtimeenv": {"build": env_id}}``), and when the
 * notebook's kernel restarts we replace it by one line with the env's state in the server.
 * The same when a notebook saved with a live build widget opens on a kernel that never had
 * it (its kernel was shut down, the server restarted): the kernel's widget comms do not
 * hold its model, and the page would say "model not found".
 */
import type { NotebookPanel } from '@jupyterlab/notebook';

import type { ITransport } from './model';

export const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';
export const METADATA_KEY = 'jupyter_runtimeenv';

/** The part of a kernel message this module reads. */
export interface IMessageLike {
  header: { msg_type: string };
  content: unknown;
}

/** The part of an output list (``IOutputAreaModel``) this module uses. */
export interface IOutputsLike {
  readonly length: number;
  get(index: number): {
    data: Record<string, unknown>;
    metadata?: Record<string, unknown>;
  };
  set(index: number, output: IStaticOutput): void;
}

export interface IStaticOutput {
  output_type: 'display_data';
  data: Record<string, unknown>;
  metadata: Record<string, unknown>;
}

/** The widget model ids a final update replaces (none for any other message). */
export function replacedModels(msg: IMessageLike): string[] {
  if (msg.header.msg_type !== 'update_display_data') {
    return [];
  }
  const content = msg.content as { metadata?: Record<string, unknown> };
  const ours = content?.metadata?.[METADATA_KEY] as
    | { replaces?: unknown }
    | undefined;
  const ids = ours?.replaces;
  return Array.isArray(ids) ? ids.filter(id => typeof id === 'string') : [];
}

/** Swap every output of ``outputs`` showing one of ``ids``; how many were swapped. */
export function replaceOutputs(
  outputs: IOutputsLike,
  ids: string[],
  output: IStaticOutput
): number {
  let swapped = 0;
  for (let i = 0; i < outputs.length; i++) {
    const view = outputs.get(i).data[WIDGET_MIME] as
      | { model_id?: unknown }
      | undefined;
    if (view && typeof view.model_id === 'string' && ids.includes(view.model_id)) {
      outputs.set(i, output);
      swapped += 1;
    }
  }
  return swapped;
}

/** Every widget model id shown by an output of ``outputs``. */
export function widgetModels(outputs: IOutputsLike): string[] {
  const ids: string[] = [];
  for (let i = 0; i < outputs.length; i++) {
    const view = outputs.get(i).data[WIDGET_MIME] as
      | { model_id?: unknown }
      | undefined;
    if (view && typeof view.model_id === 'string') {
      ids.push(view.model_id);
    }
  }
  return ids;
}

/** The env id a live build widget output shows (its display's metadata), else ``null``. */
export function liveBuild(output: {
  data: Record<string, unknown>;
  metadata?: Record<string, unknown>;
}): string | null {
  const ours = output.metadata?.[METADATA_KEY] as { build?: unknown } | undefined;
  const envId = ours?.build;
  return output.data[WIDGET_MIME] && typeof envId === 'string' ? envId : null;
}

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`);
}

/** How the kernel that showed a build widget went: ``restarted`` (it restarted or died under
 * the open notebook) or ``gone`` (the notebook opened on another kernel). */
export type KernelEnd = 'restarted' | 'gone';

/** What replaces a live build widget whose kernel restarted: its env's ``state`` in the
 * server then (``null``: the server does not know it), said so that it stays true. */
export function orphanedBuild(
  envId: string,
  state: string | null,
  end: KernelEnd = 'restarted'
): IStaticOutput {
  const id = envId.slice(0, 12);
  const kernel = end === 'restarted' ? 'the kernel restarted' : 'the kernel that showed it stopped';
  let head: string;
  let why: string;
  if (state === 'READY' || state === 'FAILED') {
    head = `${state} in the server`;
    why = `${kernel} before this cell saw it end: run the cell again`;
  } else if (state === 'BUILDING' || state === 'PENDING') {
    head = `${kernel} while it was building`;
    why = 'the build goes on in the server, the sidebar follows it: run the cell again to use it';
  } else {
    head = `${kernel} before its build ended`;
    why = 'run the cell again';
  }
  return {
    output_type: 'display_data',
    data: {
      'text/html':
        `<div><b>runtime env <code>${escapeHtml(id)}</code></b> &mdash; ` +
        `<b>${escapeHtml(head)}</b> ` +
        `<span style="color:var(--jp-ui-font-color2)">(${escapeHtml(why)})</span></div>`,
      'text/plain': `runtime env ${id} — ${head} (${why})`
    },
    metadata: { [METADATA_KEY]: { build: envId, orphaned: true } }
  };
}

/** The widget model id an output shows, else ``null``. */
function modelOf(output: { data: Record<string, unknown> }): string | null {
  const view = output.data[WIDGET_MIME] as { model_id?: unknown } | undefined;
  return view && typeof view.model_id === 'string' ? view.model_id : null;
}

/** Replace every live build widget of ``panel`` (with ``orphaned``: those whose model it
 * holds) by its env's state in the server (its kernel restarted or died, or the notebook
 * opened on another kernel: ``end``); how many were replaced. */
export async function replaceOrphanedBuilds(
  panel: NotebookPanel,
  transport: ITransport,
  orphaned: (modelId: string) => boolean = () => true,
  end: KernelEnd = 'restarted'
): Promise<number> {
  const lists = codeOutputs(panel);
  const live = (output: { data: Record<string, unknown>; metadata?: Record<string, unknown> }) => {
    const envId = liveBuild(output);
    const model = modelOf(output);
    return envId && model && orphaned(model) ? envId : null;
  };
  const envIds = new Set<string>();
  for (const outputs of lists) {
    for (let i = 0; i < outputs.length; i++) {
      const envId = live(outputs.get(i));
      if (envId) {
        envIds.add(envId);
      }
    }
  }
  const states = new Map<string, string | null>();
  for (const envId of envIds) {
    try {
      const env = await transport.request<{ state?: string }>(
        'GET',
        `envs/${encodeURIComponent(envId)}`
      );
      states.set(envId, env.state ?? null);
    } catch {
      states.set(envId, null); // removed, or the server is unreachable
    }
  }
  let swapped = 0;
  for (const outputs of lists) {
    for (let i = 0; i < outputs.length; i++) {
      const envId = live(outputs.get(i));
      if (envId && states.has(envId)) {
        outputs.set(i, orphanedBuild(envId, states.get(envId) ?? null, end));
        swapped += 1;
      }
    }
  }
  return swapped;
}

/** The widget models ``panel``'s kernel holds (its ``jupyter.widget`` comms), or ``null``
 * when it cannot say (no kernel, an error). */
async function kernelModels(panel: NotebookPanel): Promise<Set<string> | null> {
  const kernel = panel.sessionContext.session?.kernel;
  if (!kernel) {
    return null;
  }
  const reply = await kernel.requestCommInfo({ target_name: 'jupyter.widget' });
  const content = reply.content as { status: string; comms?: Record<string, unknown> };
  return content.status === 'ok' && content.comms ? new Set(Object.keys(content.comms)) : null;
}

/** Replace the live build widgets of ``panel`` that its kernel never had (a notebook saved
 * mid-build, opened on a new kernel); how many were replaced. */
export async function replaceForeignBuilds(
  panel: NotebookPanel,
  transport: ITransport
): Promise<number> {
  const held = await kernelModels(panel);
  if (!held) {
    return 0;
  }
  return replaceOrphanedBuilds(panel, transport, model => !held.has(model), 'gone');
}

/** The Python expression asking the kernel for the static forms of ``ids``. */
export function finalsExpression(ids: string[]): string {
  const module = "__import__('sys').modules.get('jupyter_runtimeenv.ipython.static')";
  // Model ids are hex strings: their JSON list is a Python list literal.
  return `getattr(${module}, 'final_bundles', lambda ids: None)(${JSON.stringify(ids)})`;
}

function codeOutputs(panel: NotebookPanel): IOutputsLike[] {
  const cells = panel.model?.cells;
  const out: IOutputsLike[] = [];
  for (let i = 0; cells && i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type === 'code') {
      out.push((cell as unknown as { outputs: IOutputsLike }).outputs);
    }
  }
  return out;
}

/** Ask ``panel``'s kernel for the final forms of the widgets the notebook shows; swap them. */
export async function fetchFinals(panel: NotebookPanel): Promise<number> {
  const kernel = panel.sessionContext.session?.kernel;
  const lists = codeOutputs(panel);
  const ids = lists.flatMap(widgetModels);
  if (!kernel || !ids.length) {
    return 0;
  }
  const future = kernel.requestExecute(
    {
      code: '',
      silent: true,
      store_history: false,
      user_expressions: { finals: finalsExpression(ids) }
    },
    true
  );
  const reply = await future.done;
  const answer = (
    reply.content as { user_expressions?: Record<string, any> }
  ).user_expressions?.finals;
  const found = answer?.status === 'ok' ? answer.data?.['application/json'] : null;
  let swapped = 0;
  for (const [id, final] of Object.entries((found ?? {}) as Record<string, any>)) {
    const output: IStaticOutput = {
      output_type: 'display_data',
      data: final.data,
      metadata: final.metadata ?? {}
    };
    for (const outputs of lists) {
      swapped += replaceOutputs(outputs, [id], output);
    }
  }
  return swapped;
}

/** Follow ``panel``'s kernel: apply final updates to outputs of any cell, fetch the finals
 * of widgets that ended while no view of this notebook listened, and replace the build
 * widgets a restarted (or dead) kernel left live, and those its kernel never had. */
export function followFinalUpdates(panel: NotebookPanel, transport: ITransport): void {
  // Finals first: a widget the kernel holds and that ended gets its own static form; then
  // a build widget the kernel never had gets the env's state in the server.
  const fetch = () =>
    void fetchFinals(panel)
      .catch(reason => console.debug('jupyter-runtimeenv: no final widget outputs', reason))
      .then(() => replaceForeignBuilds(panel, transport))
      .catch(reason => console.debug('jupyter-runtimeenv: build widgets not replaced', reason));
  void panel.sessionContext.ready.then(fetch);
  panel.sessionContext.kernelChanged.connect(fetch);
  panel.sessionContext.statusChanged.connect((_, status) => {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      void replaceOrphanedBuilds(panel, transport).catch(reason =>
        console.debug('jupyter-runtimeenv: build widgets not replaced', reason)
      );
    }
  });
  panel.sessionContext.iopubMessage.connect((_, msg) => {
    const ids = replacedModels(msg);
    const cells = panel.model?.cells;
    if (!ids.length || !cells) {
      return;
    }
    const content = msg.content as {
      data: Record<string, unknown>;
      metadata: Record<string, unknown>;
    };
    const output: IStaticOutput = {
      output_type: 'display_data',
      data: content.data,
      metadata: content.metadata
    };
    for (let i = 0; i < cells.length; i++) {
      const cell = cells.get(i);
      if (cell.type === 'code') {
        replaceOutputs(
          (cell as unknown as { outputs: IOutputsLike }).outputs,
          ids,
          output
        );
      }
    }
  });
}
