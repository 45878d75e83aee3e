/**
 * The sidebar's state: every environment the server's agent knows and every kernel's
 * workers, kept live from the server's event stream (jupyter_events), polling the REST API
 * only while the stream is down. No DOM and no JupyterLab imports: the transport is injected,
 * so the model is unit-tested alone (test/model.test.ts).
 */

import { ClusterKernels, KERNEL_SCHEMA } from './clusterKernels';
import { IGroup, byRecentUse, groupEnvs } from './groups';

/** A holder of an env reference, named as a user knows it (by the server). */
export interface IHolder {
  id: string;
  label: string;
  kind: string;
  kernel_id?: string;
}

export interface IStep {
  status?: string;
  /** What the step installs or holds, as users read it (``pip: numpy==1.26``). */
  label?: string;
  started?: number;
  ended?: number;
  bytes?: number;
  [key: string]: unknown;
}

export interface IBuildError {
  env_id?: string;
  step?: string;
  /** The failed step as users read it (``pip: numpy==9.9``). */
  label?: string;
  message?: string;
  output_tail?: string | string[];
  log_path?: string;
  [key: string]: unknown;
}

export interface IEnv {
  env_id: string;
  state: string;
  /** The spec, for the most recently used envs (``specOf`` fetches any other). */
  spec: Record<string, unknown> | null;
  /** The spec's field names (always there). */
  fields?: string[];
  error: IBuildError | null;
  steps: Record<string, IStep>;
  created: number | null;
  last_used: number | null;
  size: number | null;
  holders: IHolder[];
  /** Installer output seen live on the event stream (last lines only). */
  log: string[];
}

export interface IWorker {
  pid: number;
  busy: boolean;
  tasks_done: number;
  tasks_failed: number;
  rss: number | null;
  /** What it runs now (function or cell name) and since when (epoch seconds). */
  task?: { name: string; started: number } | null;
  /** Percent of one core it used since the kernel's previous report (since it started, at its first). */
  cpu?: number | null;
}

export interface IPool {
  env_id: string;
  name: string;
  state: string;
  max_workers: number | null;
  workers: IWorker[];
}

/** An environment the kernel declared: the default (``name`` null) or a named one. */
export interface IDeclared {
  name: string | null;
  env_id: string;
}

/** One environment on a node of a kernel's Dask cluster. */
export interface INodeEnv {
  env_id: string;
  /** The env id the kernel knows it by (its pools', its declared env's). */
  driver_env_id: string;
  state: string;
  bytes: number;
  workers: IWorker[];
}

export interface INode {
  address: string;
  name: string;
  state: string;
  cache_bytes: number;
  max_bytes: number;
  envs: INodeEnv[];
  /** Why the node could not be asked (unreachable). */
  error?: string;
}

/** A kernel's Dask cluster, as the kernel reports it. */
export interface ICluster {
  scheduler: string;
  dashboard: string | null;
  updated?: number;
  nodes: INode[];
}

export interface IKernelReport {
  kernel_id: string;
  path?: string;
  pools: IPool[];
  declared?: IDeclared[];
  cluster?: ICluster | null;
  runtime_env?: Record<string, unknown> | null;
  cwd?: string | null;
}

/** What "GC" would remove: every environment nobody holds, with the bytes it frees. */
export interface IGcPlan {
  envs: Array<{
    env_id: string;
    state: string;
    bytes: number;
    last_used: number | null;
    fields: string[];
  }>;
  bytes: number;
  held: number;
  /** Envs nobody holds whose build runs: GC leaves them (absent from older servers). */
  building?: number;
}

export interface IGcResult {
  removed: string[];
  kept: string[];
  freed_bytes: number;
}

/** A worker as the panel shows it: under its env, with the kernel it belongs to. */
export interface IEnvWorker extends IWorker {
  kernel_id: string;
  kernel_label: string;
}

export interface IOverview {
  envs: Array<Omit<IEnv, 'log'>>;
  kernels: IKernelReport[];
}

/** An event of the server's stream (a jupyter_events emission). */
export interface IEmission {
  schema_id: string;
  [key: string]: unknown;
}

export const ENV_SCHEMA = 'https://events.jupyter.org/jupyter_runtimeenv/env/v1';
export const WORKERS_SCHEMA =
  'https://events.jupyter.org/jupyter_runtimeenv/workers/v1';

/** How the model reaches the server (``ServerTransport`` in api.ts; a fake in tests). */
export interface ITransport {
  /** A JSON request to the extension's REST API (path relative to its root). */
  request<T = any>(method: string, path: string, body?: unknown): Promise<T>;
  /** Call ``onEvent`` with each event and ``onState`` when the stream opens or closes. */
  subscribe(
    onEvent: (event: IEmission) => void,
    onState: (connected: boolean) => void
  ): { dispose(): void };
}

/** A tiny signal: the widgets re-render when the model changes. */
export class Changed {
  connect(slot: () => void): () => void {
    this._slots.add(slot);
    return () => this._slots.delete(slot);
  }
  emit(): void {
    for (const slot of Array.from(this._slots)) {
      slot();
    }
  }
  private _slots = new Set<() => void>();
}

export const LOG_LINES = 40;

export interface IModelOptions {
  transport: ITransport;
  /** Seconds between polls while the event stream is down. */
  pollInterval?: number;
  /** Timers (injected by tests). */
  setTimer?: (fn: () => void, ms: number) => unknown;
  clearTimer?: (handle: unknown) => void;
}

export class RuntimeEnvModel {
  readonly changed = new Changed();
  envs = new Map<string, IEnv>();
  kernels = new Map<string, IKernelReport>();
  /** Kernels on a Dask cluster, from their provisioner's events (``clusterKernels.ts``). */
  readonly clusterKernels = new ClusterKernels();
  connected = false;
  error: string | null = null;
  loaded = false;
  /** Since when (epoch seconds) the server does not answer at all (a request failed without
   * an HTTP status: stopped, restarting, the network down); ``null`` while it answers. What
   * the model holds then is what the server said last, not what runs now. */
  unreachableSince: number | null = null;

  constructor(options: IModelOptions) {
    this._transport = options.transport;
    this.pollInterval = options.pollInterval ?? 5;
    this._setTimer = options.setTimer ?? ((fn, ms) => setTimeout(fn, ms));
    this._clearTimer =
      options.clearTimer ??
      (handle => clearTimeout(handle as ReturnType<typeof setTimeout>));
  }

  pollInterval: number;

  /** Subscribe to the event stream and load the overview. */
  start(): Promise<void> {
    if (!this._subscription) {
      this._subscription = this._transport.subscribe(
        event => this.handleEvent(event),
        connected => this.setConnected(connected)
      );
    }
    return this.refresh();
  }

  dispose(): void {
    this._subscription?.dispose();
    this._subscription = null;
    this._stopPolling();
    this._disposed = true;
  }

  /** Load every env and kernel report from the REST API. */
  async refresh(): Promise<void> {
    const ticket = ++this._refreshes;
    try {
      const overview = await this._transport.request<IOverview>(
        'GET',
        'overview'
      );
      if (ticket !== this._refreshes) {
        return; // a newer refresh started meanwhile: its answer wins
      }
      this.applyOverview(overview);
      this.error = null;
      this.unreachableSince = null;
    } catch (reason) {
      if (ticket !== this._refreshes) {
        return;
      }
      this.error = `cannot reach the server's runtime env agent: ${message(reason)}`;
      if (!answered(reason)) {
        this.unreachableSince ??= Date.now() / 1000;
      }
    }
    this.loaded = true;
    this.changed.emit();
  }

  applyOverview(overview: IOverview): void {
    const envs = new Map<string, IEnv>();
    for (const env of overview.envs) {
      envs.set(env.env_id, {
        ...env,
        log: this.envs.get(env.env_id)?.log ?? []
      });
    }
    this.envs = envs;
    this.kernels = new Map(overview.kernels.map(k => [k.kernel_id, k]));
  }

  /** Apply one event of the server's stream. */
  handleEvent(event: IEmission): void {
    if (event.schema_id === ENV_SCHEMA) {
      this._envEvent(event);
    } else if (event.schema_id === WORKERS_SCHEMA) {
      this._workersEvent(event);
    } else if (event.schema_id === KERNEL_SCHEMA && this.clusterKernels.apply(event)) {
      this.changed.emit();
    }
  }

  setConnected(connected: boolean): void {
    if (connected === this.connected) {
      return;
    }
    this.connected = connected;
    if (connected) {
      this._stopPolling();
      void this.refresh(); // whatever happened while the stream was down
    } else {
      // Ask now: when the server itself went away, the panel says so at once rather than
      // showing its last rows as live until the first poll.
      void this.refresh();
      this._schedulePoll();
    }
    this.changed.emit();
  }

  /** The panel's layout: by kernel (notebook), then the cache. */
  groups(): IGroup[] {
    return groupEnvs(this.envs, this.kernels);
  }

  /** The workers of ``envId``, across kernels. */
  workersOf(envId: string): IEnvWorker[] {
    const out: IEnvWorker[] = [];
    for (const kernel of this.kernels.values()) {
      for (const pool of kernel.pools) {
        if (pool.env_id !== envId) {
          continue;
        }
        for (const worker of pool.workers) {
          out.push({
            ...worker,
            kernel_id: kernel.kernel_id,
            kernel_label: kernel.path || `kernel ${kernel.kernel_id.slice(0, 8)}`
          });
        }
      }
    }
    return out;
  }

  /** Envs, building ones first, then by last use (most recent first). */
  sortedEnvs(): IEnv[] {
    return Array.from(this.envs.values()).sort(byRecentUse);
  }

  // -- actions ----------------------------------------------------------------------

  async rebuild(envId: string, force = false): Promise<void> {
    await this._transport.request(
      'POST',
      `envs/${envId}/rebuild${force ? '?force=true' : ''}`
    );
    await this.refresh();
  }

  /** Drop every reference the panel's user (REST holder ``user``) took. */
  async release(envId: string): Promise<void> {
    await this._transport.request(
      'DELETE',
      `envs/${envId}/holders/${encodeURIComponent('user')}`
    );
    await this.refresh();
  }

  /** The env once its build ends (READY or FAILED), or ``null`` if it went away or
   * ``timeoutMs`` passed first. Follows the model (events, or polls while they are down). */
  waitForEnd(envId: string, timeoutMs = 600_000): Promise<IEnv | null> {
    return new Promise(resolve => {
      let timer: unknown = null;
      const check = (): boolean => {
        const env = this.envs.get(envId);
        if (!env || env.state === 'READY' || env.state === 'FAILED') {
          disconnect();
          if (timer !== null) {
            this._clearTimer(timer);
          }
          resolve(env ?? null);
          return true;
        }
        return false;
      };
      const disconnect = this.changed.connect(() => void check());
      if (!check()) {
        timer = this._setTimer(() => {
          disconnect();
          resolve(null);
        }, timeoutMs);
      }
    });
  }

  async remove(envId: string, force = false): Promise<string[]> {
    const answer = await this._transport.request<{ removed: string[] }>(
      'DELETE',
      `envs/${envId}${force ? '?force=true' : ''}`
    );
    await this.refresh();
    return answer.removed;
  }

  /** What GC would remove now: every environment nobody holds. */
  async gcPlan(): Promise<IGcPlan> {
    return this._transport.request<IGcPlan>('GET', 'gc/unreferenced');
  }

  /** Remove ``envIds`` (those still unheld: one taken meanwhile is kept). */
  async gc(envIds: string[]): Promise<IGcResult> {
    const answer = await this._transport.request<IGcResult>('POST', 'gc/unreferenced', {
      env_ids: envIds
    });
    await this.refresh();
    return answer;
  }

  /** Stop a worker of a kernel: a local one, or one on ``node`` of the kernel's cluster. */
  async stopWorker(kernelId: string, pid: number, node?: string): Promise<void> {
    const query = node ? `?node=${encodeURIComponent(node)}` : '';
    await this._transport.request('DELETE', `kernels/${kernelId}/workers/${pid}${query}`);
  }

  /** Collect the node caches of a kernel's cluster; bytes freed per node. */
  async clusterGc(
    kernelId: string
  ): Promise<{ nodes: Record<string, number>; freed_bytes: number }> {
    return this._transport.request('POST', `kernels/${kernelId}/gc`, {});
  }

  /** The env's spec: from the overview, else ``GET envs/{id}``. */
  async specOf(envId: string): Promise<Record<string, unknown>> {
    const env = this.envs.get(envId);
    if (env?.spec) {
      return env.spec;
    }
    const full = await this._transport.request<{ spec: Record<string, unknown> }>(
      'GET',
      `envs/${envId}`
    );
    return full.spec;
  }

  async fullLog(envId: string): Promise<string> {
    return this._transport.request<string>('GET', `envs/${envId}/log`);
  }

  // -- internals --------------------------------------------------------------------

  private _envEvent(event: IEmission): void {
    const envId = String(event.env_id ?? '');
    const env = this.envs.get(envId);
    if (event.kind === 'holders') {
      this._scheduleRefresh(); // who holds it, named as users know them: from the overview
      return;
    }
    if (event.kind === 'state') {
      if (event.removed) {
        this.envs.delete(envId);
        this.changed.emit();
        return;
      }
      if (env) {
        env.state = String(event.state);
        if (event.error) {
          env.error = event.error as IBuildError;
        }
        if (env.state === 'PENDING') {
          env.log = [];
          env.error = null;
        }
        this.changed.emit();
      }
      // Sizes, holders and specs come from the overview: fetch it once per burst.
      this._scheduleRefresh();
      return;
    }
    if (!env) {
      this._scheduleRefresh();
      return;
    }
    const step = String(event.step ?? '');
    if (event.kind === 'step') {
      env.steps = {
        ...env.steps,
        [step]: {
          ...(env.steps[step] ?? {}),
          ...((event.info as object) ?? {}),
          status: String(event.status ?? '')
        }
      };
    } else if (event.kind === 'log') {
      const lines = (event.lines as string[]) ?? [];
      env.log = env.log.concat(lines).slice(-LOG_LINES);
    }
    this.changed.emit();
  }

  private _workersEvent(event: IEmission): void {
    const kernelId = String(event.kernel_id ?? '');
    if (event.kind === 'gone') {
      this.kernels.delete(kernelId);
    } else {
      const old = this.kernels.get(kernelId);
      this.kernels.set(kernelId, {
        kernel_id: kernelId,
        path: old?.path,
        pools: (event.pools as IPool[]) ?? [],
        declared: (event.declared as IDeclared[] | undefined) ?? old?.declared ?? [],
        cluster:
          event.cluster !== undefined
            ? (event.cluster as ICluster | null)
            : (old?.cluster ?? null),
        runtime_env: old?.runtime_env ?? null,
        cwd: old?.cwd ?? null
      });
      if (!old) {
        this._scheduleRefresh(); // the notebook path comes with the overview
      }
    }
    this.changed.emit();
  }

  private _scheduleRefresh(): void {
    if (this._refreshTimer !== null || this._disposed) {
      return;
    }
    this._refreshTimer = this._setTimer(() => {
      this._refreshTimer = null;
      void this.refresh();
    }, 150);
  }

  private _schedulePoll(): void {
    if (this._pollTimer !== null || this._disposed) {
      return;
    }
    this._pollTimer = this._setTimer(async () => {
      this._pollTimer = null;
      if (this.connected || this._disposed) {
        return;
      }
      await this.refresh();
      this._schedulePoll();
    }, this.pollInterval * 1000);
  }

  private _stopPolling(): void {
    if (this._pollTimer !== null) {
      this._clearTimer(this._pollTimer);
      this._pollTimer = null;
    }
  }

  private _refreshes = 0;
  private _transport: ITransport;
  private _subscription: { dispose(): void } | null = null;
  private _setTimer: (fn: () => void, ms: number) => unknown;
  private _clearTimer: (handle: unknown) => void;
  private _refreshTimer: unknown = null;
  private _pollTimer: unknown = null;
  private _disposed = false;
}

/** Did the server answer (an HTTP status: ``RequestError``), rather than not at all? */
function answered(reason: unknown): boolean {
  return typeof (reason as { status?: unknown } | null)?.status === 'number';
}

function message(reason: unknown): string {
  return reason instanceof Error ? reason.message : String(reason);
}

/** The state a notebook's badge shows for its metadata env. */
export type NotebookEnvState =
  | 'cached'
  | 'building'
  | 'failed'
  | 'missing'
  | 'unknown';

export interface INotebookEnvStatus {
  state: NotebookEnvState;
  /** The env this server has for it (the id the kernel shows); none when it is missing. */
  env_id?: string | null;
  error?: IBuildError | null;
  /** The default's own state (``state`` is the worst of all); absent without a default. */
  default?: INamedEnvStatus | null;
  /** The named envs the notebook carries, by name. */
  named?: INamedEnvStatus[];
  /** How the envs that run differ from the notebook's locks, one line a package (a named
   * env's lines start with its name); empty when they agree. */
  lock_differences?: string[];
}

export interface INamedEnvStatus {
  name: string | null;
  state: NotebookEnvState;
  env_id?: string | null;
  error?: IBuildError | null;
  /** With a lock: does the env that runs it have the lock's versions (``unchecked``: no
   * such env built here)? */
  lock?: 'matches' | 'differs' | 'unchecked';
  lock_differences?: string[];
}

/** ``metadata.runtime_env``: the default's spec and/or named envs' specs. */
export interface INotebookEnv {
  version: number;
  spec?: Record<string, unknown>;
  env_id?: string;
  /** PEP 751 ``pylock.toml`` text: the versions the env had when saved. */
  lock?: string;
  named?: Record<
    string,
    { spec: Record<string, unknown>; env_id?: string; lock?: string }
  >;
}

/** Is ``metadata.runtime_env`` something the badge can show (a default or a named env)? */
export function isNotebookEnv(value: unknown): value is INotebookEnv {
  if (!value || typeof value !== 'object') {
    return false;
  }
  const { spec, named } = value as { spec?: unknown; named?: unknown };
  const isObject = (v: unknown) => !!v && typeof v === 'object' && !Array.isArray(v);
  return isObject(spec) || (isObject(named) && Object.keys(named as object).length > 0);
}
