/**
 * The sidebar (React through ``ReactWidget``): a header (live or polling, GC, refresh), then
 * the environments grouped by notebook (each kernel's, titled by the names they were declared
 * with, with the kernel's Dask cluster when it has one), then the cache. It renders the model
 * (``model.ts``; its layout: ``groups.ts``) at most once per frame, in keyed lists: a live
 * update keeps scroll positions, expanded cards and focus. Every action says what it did, or
 * why it did nothing, in a notification.
 */
import {
  Clipboard,
  Dialog,
  Notification,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import {
  ReactWidget,
  caretDownIcon,
  caretRightIcon,
  notebookIcon,
  refreshIcon
} from '@jupyterlab/ui-components';
import * as React from 'react';

import { ActionButton, EnvCard, ICardActions, StaleContext } from './card';
import { ClusterSection, IClusterActions } from './cluster';
import { ClusterKernelsView } from './clusterKernelsView';
import {
  failedStep,
  firstLine,
  formatBytes,
  gcKept,
  gcStay,
  portableSpec,
  specBrief,
  specToYaml
} from './format';
import { IGroup, declaredNames } from './groups';
import { IEnv, IEnvWorker, IGcPlan, RuntimeEnvModel } from './model';
import { INotifier, Progress } from './notice';

const NOTIFIER: INotifier = {
  emit: (text, type, options) => Notification.emit(text, type, options),
  dismiss: id => Notification.dismiss(id)
};

export interface IPanelOptions {
  model: RuntimeEnvModel;
  /** The ``confirmDelete`` setting: ask before deleting a held env and before GC. */
  confirmDelete: () => boolean;
  /** Open an env's whole build log (the ``runtimeenv:view-log`` command). */
  openLog: (envId: string) => void;
  /** A kernel as people know it (its notebook's path); default: its short id. */
  kernelLabel?: (kernelId: string) => string;
}

/** Re-render on model changes, at most once per animation frame (build logs are chatty). */
function useModel(model: RuntimeEnvModel): void {
  const [, setTick] = React.useState(0);
  React.useEffect(() => {
    let frame: number | null = null;
    const disconnect = model.changed.connect(() => {
      if (frame === null) {
        frame = requestAnimationFrame(() => {
          frame = null;
          setTick(t => t + 1);
        });
      }
    });
    return () => {
      disconnect();
      if (frame !== null) {
        cancelAnimationFrame(frame);
      }
    };
  }, [model]);
}

/** The time now in epoch seconds, refreshed every ``ms``. */
function useNow(ms: number): number {
  const [now, setNow] = React.useState(Date.now() / 1000);
  React.useEffect(() => {
    const timer = setInterval(() => setNow(Date.now() / 1000), ms);
    return () => clearInterval(timer);
  }, [ms]);
  return now;
}

function toggled(set: Set<string>, key: string): Set<string> {
  const next = new Set(set);
  if (next.has(key)) {
    next.delete(key);
  } else {
    next.add(key);
  }
  return next;
}

function envName(model: RuntimeEnvModel, env: IEnv): string {
  const names = declaredNames(model.kernels, env.env_id);
  return names.length ? names[0] : specBrief(env.spec, env.fields);
}

function message(reason: unknown): string {
  return reason instanceof Error ? reason.message : String(reason);
}

/** The panel's actions: dialogs, the model's requests, and a notification for each. */
class Actions implements ICardActions {
  constructor(private options: IPanelOptions) {}

  get model(): RuntimeEnvModel {
    return this.options.model;
  }

  viewLog(envId: string): void {
    this.options.openLog(envId);
  }

  async rebuild(env: IEnv): Promise<void> {
    const name = envName(this.model, env);
    const held = env.state === 'READY' && env.holders.length > 0;
    if (held) {
      const answer = await showDialog({
        title: 'Rebuild a held environment?',
        body: `${name} (${env.env_id.slice(0, 12)}) is held by ${env.holders.map(h => h.label).join(', ')}. It is removed and built again; they keep holding it, and their running workers keep the old files until they stop.`,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Rebuild' })]
      });
      if (!answer.button.accept) {
        return;
      }
    }
    const progress = new Progress(`Rebuilding ${name}…`, NOTIFIER);
    try {
      await this.model.rebuild(env.env_id, held);
      const end = await this.model.waitForEnd(env.env_id);
      if (end?.state === 'READY') {
        progress.end(`${name} rebuilt: READY`, 'success', { autoClose: 5000 });
      } else if (end?.state === 'FAILED') {
        const step = failedStep(end);
        progress.end(
          `Rebuild of ${name} failed${step ? ` at ${step}` : ''}: ${firstLine(end.error?.message)}`,
          'error',
          {
            autoClose: false,
            actions: [{ label: 'View log', callback: () => this.viewLog(env.env_id) }]
          }
        );
      } else {
        progress.end(`${name}: the rebuild is still running`, 'info', { autoClose: 5000 });
      }
    } catch (reason) {
      progress.end(`Rebuild of ${name}: ${message(reason)}`, 'error', { autoClose: false });
    }
  }

  async release(env: IEnv): Promise<void> {
    await this.act(async () => {
      await this.model.release(env.env_id);
      Notification.success(
        `Released the REST reference to ${envName(this.model, env)}` +
          (env.holders.length > 1 ? '; others still hold it' : ': nothing holds it now (GC removes it)'),
        { autoClose: 5000 }
      );
    });
  }

  async remove(env: IEnv): Promise<void> {
    const name = envName(this.model, env);
    const held = env.holders.length > 0;
    if (held && this.options.confirmDelete()) {
      const answer = await showDialog({
        title: 'Delete a held environment?',
        body: `${name} (${env.env_id.slice(0, 12)}) is held by ${env.holders.map(h => h.label).join(', ')}. Its files are removed; they keep holding it and it is built again at their next use.`,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
      });
      if (!answer.button.accept) {
        return;
      }
    }
    await this.act(async () => {
      const removed = await this.model.remove(env.env_id, held);
      Notification.success(
        `Deleted ${name} (${formatBytes(env.size)}; ${removed.length} resource${removed.length === 1 ? '' : 's'} no other env uses)`,
        { autoClose: 5000 }
      );
    });
  }

  async copy(env: IEnv): Promise<void> {
    await this.act(async () => {
      const spec = portableSpec(await this.model.specOf(env.env_id));
      Clipboard.copyToSystem(specToYaml(spec));
      Notification.info(`Copied the spec of ${envName(this.model, env)} as YAML`, {
        autoClose: 3000
      });
    });
  }

  async stopWorker(worker: IEnvWorker, node?: string): Promise<void> {
    await this.act(async () => {
      await this.model.stopWorker(worker.kernel_id, worker.pid, node);
      Notification.info(
        `Stopped worker ${worker.pid} of ${worker.kernel_label}${node ? ` on ${node}` : ''}` +
          (worker.busy ? ': its task fails with BrokenWorker' : ''),
        { autoClose: 5000 }
      );
    });
  }

  /** GC: every environment nobody holds, after a confirmation that lists them. */
  async gc(): Promise<void> {
    let plan: IGcPlan;
    try {
      plan = await this.model.gcPlan();
    } catch (reason) {
      await showErrorMessage('Runtime environments', reason as Error);
      return;
    }
    if (!plan.envs.length) {
      Notification.info(
        plan.held || plan.building
          ? `Nothing to collect: ${gcKept(plan.held, plan.building)} ${gcStay(plan.held, plan.building)}`
          : 'Nothing to collect: the cache is empty',
        { autoClose: 5000 }
      );
      return;
    }
    if (this.options.confirmDelete()) {
      const body = (
        <div className="jp-RuntimeEnv-gcList">
          <p>Remove every environment nobody holds:</p>
          <ul>
            {plan.envs.map(e => {
              const env = this.model.envs.get(e.env_id);
              return (
                <li key={e.env_id}>
                  <span className="jp-RuntimeEnv-name">
                    {env ? envName(this.model, env) : specBrief(null, e.fields)}
                  </span>{' '}
                  <span className="jp-RuntimeEnv-id">{e.env_id.slice(0, 12)}</span>{' '}
                  <span className="jp-RuntimeEnv-meta">
                    {e.state} · {formatBytes(e.bytes)}
                  </span>
                </li>
              );
            })}
          </ul>
          <p>
            {plan.envs.length} environment{plan.envs.length === 1 ? '' : 's'},{' '}
            {formatBytes(plan.bytes)} freed.{plan.held || plan.building
              ? ` ${gcKept(plan.held, plan.building)} ${gcStay(plan.held, plan.building)}.`
              : ''}
          </p>
        </div>
      );
      const answer = await showDialog({
        title: 'Collect unused environments?',
        body,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Remove' })]
      });
      if (!answer.button.accept) {
        return;
      }
    }
    await this.act(async () => {
      const result = await this.model.gc(plan.envs.map(e => e.env_id));
      const kept = result.kept.length
        ? ` (${result.kept.length} kept: taken meanwhile)`
        : '';
      Notification.success(
        `GC removed ${result.removed.length} environment${result.removed.length === 1 ? '' : 's'} and freed ${formatBytes(result.freed_bytes)}${kept}`,
        { autoClose: 6000 }
      );
    });
  }

  clusterActions(group: IGroup): IClusterActions {
    return {
      stopWorker: (worker, node) => void this.stopWorker(worker, node),
      gc: () =>
        void this.act(async () => {
          const answer = await this.model.clusterGc(group.kernelId!);
          Notification.success(
            `GC on ${Object.keys(answer.nodes).length} nodes of ${group.title}'s cluster freed ${formatBytes(answer.freed_bytes)}`,
            { autoClose: 6000 }
          );
        }),
      titleOf: envId => {
        const declared = group.kernel?.declared?.find(d => d.env_id === envId);
        return declared ? (declared.name ?? '(default)') : null;
      }
    };
  }

  private async act(action: () => Promise<unknown>): Promise<void> {
    try {
      await action();
    } catch (reason) {
      Notification.error(`Runtime environments: ${message(reason)}`, { autoClose: false });
    }
  }
}

function GroupView(props: {
  group: IGroup;
  collapsed: boolean;
  onToggle: () => void;
  expanded: Set<string>;
  onToggleCard: (key: string) => void;
  now: number;
  actions: Actions;
}): JSX.Element {
  const { group, collapsed, now, actions } = props;
  const workers = group.entries.reduce((n, e) => n + e.workers.length, 0);
  const Caret = collapsed ? caretRightIcon : caretDownIcon;
  const nodes = group.kernel?.cluster?.nodes.length ?? 0;
  const parts = [
    group.entries.length || !nodes
      ? `${group.entries.length} env${group.entries.length === 1 ? '' : 's'}`
      : '',
    nodes ? `Dask: ${nodes} node${nodes === 1 ? '' : 's'}` : '',
    workers ? `${workers} worker${workers === 1 ? '' : 's'}` : '',
    group.bytes ? formatBytes(group.bytes) : ''
  ].filter(Boolean);
  return (
    <section
      className={`jp-RuntimeEnv-group jp-mod-${group.kind}`}
      data-group={group.kind === 'kernel' ? group.title : 'cache'}
    >
      <div
        className="jp-RuntimeEnv-groupHead"
        role="button"
        tabIndex={0}
        aria-expanded={!collapsed}
        onClick={props.onToggle}
        onKeyDown={event => {
          if (event.key === 'Enter' || event.key === ' ') {
            event.preventDefault();
            props.onToggle();
          }
        }}
      >
        <Caret.react tag="span" className="jp-RuntimeEnv-caret" />
        {group.kind === 'kernel' && (
          <notebookIcon.react tag="span" className="jp-RuntimeEnv-groupIcon" />
        )}
        <span className="jp-RuntimeEnv-groupTitle" title={group.title}>
          {group.title}
        </span>
        <span className="jp-RuntimeEnv-meta">{parts.join(' · ')}</span>
      </div>
      {!collapsed && (
        <div className="jp-RuntimeEnv-groupBody">
          {group.kind === 'cache' && !group.entries.length && (
            <div className="jp-RuntimeEnv-empty">No other environments.</div>
          )}
          {group.entries.map(entry => (
            <EnvCard
              key={entry.key}
              entry={entry}
              now={now}
              expanded={props.expanded.has(entry.key)}
              onToggle={() => props.onToggleCard(entry.key)}
              actions={actions}
            />
          ))}
          {group.kernel?.cluster && (
            <ClusterSection
              cluster={group.kernel.cluster}
              kernelId={group.kernelId!}
              kernelLabel={group.title}
              now={now}
              actions={actions.clusterActions(group)}
            />
          )}
        </div>
      )}
    </section>
  );
}

export function PanelView(props: { options: IPanelOptions }): JSX.Element {
  const { model } = props.options;
  useModel(model);
  const actions = React.useMemo(() => new Actions(props.options), [props.options]);
  const [expanded, setExpanded] = React.useState<Set<string>>(new Set());
  const [collapsed, setCollapsed] = React.useState<Set<string>>(new Set());
  const groups = model.groups();
  const busy = groups.some(g => g.entries.some(e => e.workers.some(w => w.busy)));
  const building = Array.from(model.envs.values()).some(
    e => e.state === 'BUILDING' || e.state === 'PENDING'
  );
  const ticking = useNow(busy || building ? 1000 : 15000);
  const since = model.unreachableSince;
  const stale = since !== null;
  // While the server does not answer, its last rows stay still: no task's time counts up.
  const now = since ?? ticking;
  const empty = !model.envs.size && !model.kernels.size;
  const live = stale
    ? {
        label: 'offline',
        mod: 'jp-mod-offline',
        title: `The server does not answer since ${clock(since)}: asking it every ${model.pollInterval} s`
      }
    : model.connected
      ? { label: 'live', mod: 'jp-mod-live', title: 'Following the server live' }
      : {
          label: 'polling',
          mod: 'jp-mod-polling',
          title: `The event stream is down: asking the server every ${model.pollInterval} s`
        };
  return (
    <div className="jp-RuntimeEnv-root">
      <div className="jp-RuntimeEnv-header">
        <span className="jp-RuntimeEnv-title">Environments</span>
        <span className={`jp-RuntimeEnv-live ${live.mod}`} title={live.title}>
          {live.label}
        </span>
        <ActionButton
          label="GC"
          className="jp-RuntimeEnv-gc"
          title={
            stale
              ? 'The server does not answer'
              : 'Remove every environment nobody holds (you see the list and their sizes first)'
          }
          disabled={stale}
          onClick={() => void actions.gc()}
        />
        <ActionButton
          label=""
          icon={refreshIcon}
          className="jp-RuntimeEnv-refresh"
          title="Refresh"
          onClick={() => void model.refresh()}
        />
      </div>
      {stale ? (
        <div className="jp-RuntimeEnv-notice jp-mod-error jp-RuntimeEnv-unreachable">
          The Jupyter server does not answer since {clock(since)} (stopped or restarting?).
          Below is what it said last, not what runs now; this panel follows it again when it is
          back.
        </div>
      ) : (
        model.error && <div className="jp-RuntimeEnv-notice jp-mod-error">{model.error}</div>
      )}
      <ClusterKernelsView
        kernels={model.clusterKernels.list()}
        label={props.options.kernelLabel ?? (id => `kernel ${id.slice(0, 8)}`)}
        onDismiss={id => {
          if (model.clusterKernels.dismiss(id)) {
            model.changed.emit();
          }
        }}
      />
      <StaleContext.Provider value={stale}>
      {/* A disabled fieldset disables every button in it: nothing to act on while the
          server is away. */}
      <fieldset
        className={`jp-RuntimeEnv-list${stale ? ' jp-mod-stale' : ''}`}
        disabled={stale}
      >
        {empty ? (
          <div className="jp-RuntimeEnv-empty">
            {model.loaded
              ? 'No environments yet. Declare one in a notebook: %load_ext jupyter_runtimeenv, then %runtime_env --pip ...'
              : 'Loading…'}
          </div>
        ) : (
          groups.map(group => (
            <GroupView
              key={group.key}
              group={group}
              collapsed={collapsed.has(group.key)}
              onToggle={() => setCollapsed(c => toggled(c, group.key))}
              expanded={expanded}
              onToggleCard={key => setExpanded(e => toggled(e, key))}
              now={now}
              actions={actions}
            />
          ))
        )}
      </fieldset>
      </StaleContext.Provider>
    </div>
  );
}

/** ``14:02:09``: the local time of epoch seconds ``at``. */
function clock(at: number): string {
  return new Date(at * 1000).toLocaleTimeString([], { hour12: false });
}

export class RuntimeEnvPanel extends ReactWidget {
  constructor(readonly options: IPanelOptions) {
    super();
    this.addClass('jp-RuntimeEnvPanel');
    this.id = 'jupyter-runtimeenv-panel';
    this.title.caption = 'Runtime Environments';
  }

  render(): JSX.Element {
    return <PanelView options={this.options} />;
  }
}
