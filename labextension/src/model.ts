/**
 * The sidebar's state: every environment the server's agent knows and every kernel's
 * workers, kept live from the server's event stream (jupyter_events), polling the REST API
 * only while the stream is down. No DOM and no JupyterLab imports: the transport is injected,
 * so the model is unit-tested alone (test/model.test.ts).
 */

import { ClusterKernels, KERNEL_SCHEMA } from './clusterKernels';

/** A holder of an env reference, named as a user knows it (by the server). */
export interface IHolder {
  id: string;
  label: string;
  kind: string;
  kernel_id?: string;
}

export interface IStep {
  status?: string;
  started?: number;
  ended?: number;
  bytes?: number;
  [key: string]: unknown;
}

export interface IBuildError {
  env_id?: string;
  step?: string;
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
}

export interface IPool {
  env_id: string;
  name: string;
  state: string;
  max_workers: number | null;
  workers: IWorker[];
}

export interface IKernelReport {
  kernel_id: string;
  path?: string;
  pools: IPool[];
  runtime_env?: Record<string, unknown> | null;
  cwd?: string | null;
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
    } catch (reason) {
      if (ticket !== this._refreshes) {
        return;
      }
      this.error = `cannot reach the server's runtime env agent: ${message(reason)}`;
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
      this._schedulePoll();
    }
    this.changed.emit();
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
    const rank: Record<string, number> = {
      BUILDING: 0,
      PENDING: 0,
      FAILED: 1,
      READY: 2
    };
    return Array.from(this.envs.values()).sort(
      (a, b) =>
        (rank[a.state] ?? 3) - (rank[b.state] ?? 3) ||
        (b.last_used ?? b.created ?? 0) - (a.last_used ?? a.created ?? 0)
    );
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

  async remove(envId: string, force = false): Promise<string[]> {
    const answer = await this._transport.request<{ removed: string[] }>(
      'DELETE',
      `envs/${envId}${force ? '?force=true' : ''}`
    );
    await this.refresh();
    return answer.removed;
  }

  /** Evict unreferenced resources; the bytes freed. */
  async gc(): Promise<number> {
    const answer = await this._transport.request<{ freed_bytes: number }>(
      'POST',
      'gc',
      {}
    );
    await this.refresh();
    return answer.freed_bytes;
  }

  async stopWorker(kernelId: string, pid: number): Promise<void> {
    await this._transport.request(
      'DELETE',
      `kernels/${kernelId}/workers/${pid}`
    );
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

// -- formatting (pure) ------------------------------------------------------------------

function message(reason: unknown): string {
  return reason instanceof Error ? reason.message : String(reason);
}

/** ``pip: numpy, pandas · working_dir: data/ · env_vars: 2``; the field names alone when
 * the overview did not carry the spec. */
export function specBrief(
  spec: Record<string, unknown> | null,
  fields: string[] = []
): string {
  if (!spec) {
    const names = fields.filter(f => !DRIVER_KEYS.includes(f));
    return names.length ? names.join(' · ') : 'no packages (the driver’s Python)';
  }
  const parts: string[] = [];
  for (const [key, value] of Object.entries(spec)) {
    if (key === 'config' || DRIVER_KEYS.includes(key)) {
      continue;
    }
    parts.push(`${key}: ${briefValue(key, value)}`);
  }
  return parts.length ? parts.join(' · ') : 'no packages (the driver’s Python)';
}

const DRIVER_KEYS = ['driver_python', 'driver_sys_path'];

function briefValue(key: string, value: unknown): string {
  if (key === 'pip' || key === 'uv') {
    const packages = Array.isArray(value)
      ? value
      : ((value as { packages?: unknown })?.packages ?? value);
    if (Array.isArray(packages)) {
      return packages.map(p => requirementName(String(p))).join(', ');
    }
    return basename(String(packages));
  }
  if (key === 'plugins' && value && typeof value === 'object') {
    return Object.keys(value)
      .map(path => path.split('.').pop())
      .join(', ');
  }
  if (key === 'env_vars' && value && typeof value === 'object') {
    return String(Object.keys(value).length);
  }
  if (key === 'working_dir') {
    return basename(String(value)) + '/';
  }
  if (key === 'py_modules' && Array.isArray(value)) {
    return value.map(v => basename(String(v))).join(', ');
  }
  if (typeof value === 'string') {
    return basename(value);
  }
  if (Array.isArray(value)) {
    return String(value.length);
  }
  if (value && typeof value === 'object') {
    return Object.keys(value).join(', ');
  }
  return String(value);
}

/** ``numpy==1.26`` -> ``numpy``; a path -> its last part. */
export function requirementName(requirement: string): string {
  if (requirement.includes('/')) {
    return basename(requirement);
  }
  const match = /^[A-Za-z0-9._-]+(\[[^\]]*\])?/.exec(requirement.trim());
  return match ? match[0] : requirement;
}

function basename(path: string): string {
  const parts = path.replace(/\/+$/, '').split('/');
  return parts[parts.length - 1] || path;
}

export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) {
    return '–';
  }
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return unit === 0
    ? `${value} B`
    : `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

/** ``12 s``, ``5 min``, ``3 h``, ``2 d`` ago, from epoch seconds. */
export function formatAge(
  epochSeconds: number | null | undefined,
  now: number = Date.now() / 1000
): string {
  if (!epochSeconds) {
    return '–';
  }
  const seconds = Math.max(0, now - epochSeconds);
  if (seconds < 60) {
    return `${Math.round(seconds)} s`;
  }
  if (seconds < 3600) {
    return `${Math.round(seconds / 60)} min`;
  }
  if (seconds < 86400) {
    return `${Math.round(seconds / 3600)} h`;
  }
  return `${Math.round(seconds / 86400)} d`;
}

/** The step that failed (from the error, else the first failed step). */
export function failedStep(env: IEnv): string | null {
  if (env.error?.step) {
    return String(env.error.step);
  }
  for (const [name, step] of Object.entries(env.steps)) {
    if (step.status === 'failed') {
      return name;
    }
  }
  return null;
}

/** A spec as YAML (flat, good enough for ``copy spec``; JSON values where nested). */
export function specToYaml(spec: Record<string, unknown>): string {
  const lines: string[] = [];
  const emit = (value: unknown, indent: string): void => {
    if (Array.isArray(value)) {
      for (const item of value) {
        if (item && typeof item === 'object') {
          lines.push(`${indent}- ${JSON.stringify(item)}`);
        } else {
          lines.push(`${indent}- ${scalar(item)}`);
        }
      }
      return;
    }
    for (const [key, item] of Object.entries(value as Record<string, unknown>)) {
      if (item && typeof item === 'object') {
        if (Array.isArray(item) && item.length === 0) {
          lines.push(`${indent}${key}: []`);
        } else if (!Array.isArray(item) && Object.keys(item).length === 0) {
          lines.push(`${indent}${key}: {}`);
        } else {
          lines.push(`${indent}${key}:`);
          emit(item, indent + '  ');
        }
      } else {
        lines.push(`${indent}${key}: ${scalar(item)}`);
      }
    }
  };
  emit(spec, '');
  return lines.join('\n') + '\n';
}

function scalar(value: unknown): string {
  if (typeof value === 'string') {
    return /^[A-Za-z0-9_./][A-Za-z0-9_./=<>~!,* -]*$/.test(value) &&
      !/^(true|false|null|yes|no|on|off|[0-9.]+)$/i.test(value)
      ? value
      : JSON.stringify(value);
  }
  return JSON.stringify(value);
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
  env_id?: string;
  error?: IBuildError | null;
}

/** Is ``metadata.runtime_env`` something the badge can show? */
export function isNotebookEnv(value: unknown): value is {
  version: number;
  spec: Record<string, unknown>;
} {
  return (
    !!value &&
    typeof value === 'object' &&
    typeof (value as { spec?: unknown }).spec === 'object' &&
    (value as { spec?: unknown }).spec !== null
  );
}
