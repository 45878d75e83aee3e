/**
 * The sidebar's layout as plain data (pure, unit-tested): environments grouped the way a user
 * thinks of them — by the notebook (kernel) that declared or uses them, each titled by the
 * name it was declared with (``(default)``, ``slow``) — and below, the cache: every other
 * environment the server's agent keeps.
 */
import { specBrief } from './format';
import type { IEnv, IEnvWorker, IKernelReport } from './model';

/** One environment as a group shows it. */
export interface IEntry {
  /** Unique in the panel (the group's key and the env id): React's key, expansion state. */
  key: string;
  envId: string;
  /** ``null``: declared by the kernel but not in the agent (deleted, or not built yet). */
  env: IEnv | null;
  /** What the user called it: ``(default)``, a name, ``kernel's env``; else the spec brief. */
  title: string;
  /** Whether ``title`` is a name the user gave (shown first, the id secondary). */
  named: boolean;
  /** The workers of this group's kernel in it (in the cache group: every kernel's). */
  workers: IEnvWorker[];
}

export interface IGroup {
  key: string;
  kind: 'kernel' | 'cache';
  /** The notebook's path (or ``kernel <id8>``), or ``Cache``. */
  title: string;
  kernelId: string | null;
  kernel: IKernelReport | null;
  entries: IEntry[];
  /** Bytes of the group's environments (each counted once). */
  bytes: number;
}

const DEFAULT_TITLE = '(default)';
const KERNEL_ENV_TITLE = 'kernel’s env';

function kernelWorkers(kernel: IKernelReport | null, envId: string, label: string): IEnvWorker[] {
  const out: IEnvWorker[] = [];
  for (const pool of kernel?.pools ?? []) {
    if (pool.env_id !== envId) {
      continue;
    }
    for (const worker of pool.workers) {
      out.push({ ...worker, kernel_id: kernel!.kernel_id, kernel_label: label });
    }
  }
  return out;
}

/** The label a kernel's holders give it (the notebook path, from the server). */
function holderLabels(envs: Map<string, IEnv>): Map<string, string> {
  const labels = new Map<string, string>();
  for (const env of envs.values()) {
    for (const holder of env.holders) {
      if (holder.kind === 'kernel' && holder.kernel_id && !labels.has(holder.kernel_id)) {
        labels.set(holder.kernel_id, holder.label.replace(/ \([^)]*\)$/, ''));
      }
    }
  }
  return labels;
}

/** Every group: the kernels' (by title), then the cache. */
export function groupEnvs(
  envs: Map<string, IEnv>,
  kernels: Map<string, IKernelReport>,
  order: (a: IEnv, b: IEnv) => number = byRecentUse
): IGroup[] {
  const labels = holderLabels(envs);
  const kernelIds = new Set<string>([...kernels.keys(), ...labels.keys()]);
  const shown = new Set<string>();
  const groups: IGroup[] = [];
  for (const kernelId of kernelIds) {
    const kernel = kernels.get(kernelId) ?? null;
    const title = kernel?.path || labels.get(kernelId) || `kernel ${kernelId.slice(0, 8)}`;
    const entries: IEntry[] = [];
    const add = (envId: string, name: string | null, named: boolean) => {
      if (entries.some(e => e.envId === envId)) {
        return;
      }
      const env = envs.get(envId) ?? null;
      entries.push({
        key: `kernel:${kernelId}:${envId}`,
        envId,
        env,
        title: name ?? specBrief(env?.spec ?? null, env?.fields),
        named,
        workers: kernelWorkers(kernel, envId, title)
      });
      shown.add(envId);
    };
    // Envs the kernel runs on its Dask cluster show under the cluster's nodes (by name), not
    // as local cards "not in the cache" when this server's cache does not have them.
    const onCluster = new Set(
      (kernel?.cluster?.nodes ?? []).flatMap(node => node.envs.map(env => env.driver_env_id))
    );
    for (const declared of kernel?.declared ?? []) {
      if (onCluster.has(declared.env_id) && !envs.has(declared.env_id)) {
        continue;
      }
      add(declared.env_id, declared.name ?? DEFAULT_TITLE, true);
    }
    for (const pool of kernel?.pools ?? []) {
      add(pool.env_id, null, false);
    }
    for (const env of Array.from(envs.values()).sort(order)) {
      for (const holder of env.holders) {
        if (holder.kernel_id !== kernelId) {
          continue;
        }
        const own = holder.id === `kernel:${kernelId}`; // the provisioner's: the kernel runs in it
        add(env.env_id, own ? KERNEL_ENV_TITLE : null, own);
      }
    }
    if (entries.length || kernel?.cluster) {
      groups.push({
        key: `kernel:${kernelId}`,
        kind: 'kernel',
        title,
        kernelId,
        kernel,
        entries,
        bytes: sumBytes(entries)
      });
    }
  }
  groups.sort((a, b) => a.title.localeCompare(b.title));
  const rest = Array.from(envs.values())
    .filter(env => !shown.has(env.env_id))
    .sort(order)
    .map(env => ({
      key: `cache:${env.env_id}`,
      envId: env.env_id,
      env,
      title: specBrief(env.spec, env.fields),
      named: false,
      workers: allWorkers(kernels, env.env_id)
    }));
  groups.push({
    key: 'cache',
    kind: 'cache',
    title: 'Cache',
    kernelId: null,
    kernel: null,
    entries: rest,
    bytes: sumBytes(rest)
  });
  return groups;
}

function allWorkers(kernels: Map<string, IKernelReport>, envId: string): IEnvWorker[] {
  return Array.from(kernels.values()).flatMap(k =>
    kernelWorkers(k, envId, k.path || `kernel ${k.kernel_id.slice(0, 8)}`)
  );
}

function sumBytes(entries: IEntry[]): number {
  return entries.reduce((total, e) => total + (e.env?.size ?? 0), 0);
}

const RANK: Record<string, number> = { BUILDING: 0, PENDING: 0, FAILED: 1, READY: 2 };

/** Building envs first, then failed, then by last use (most recent first). */
export function byRecentUse(a: IEnv, b: IEnv): number {
  return (
    (RANK[a.state] ?? 3) - (RANK[b.state] ?? 3) ||
    (b.last_used ?? b.created ?? 0) - (a.last_used ?? a.created ?? 0)
  );
}

/** Every name ``envId`` was declared with, by any kernel (``slow · b.ipynb``). */
export function declaredNames(
  kernels: Map<string, IKernelReport>,
  envId: string
): string[] {
  const names: string[] = [];
  for (const kernel of kernels.values()) {
    for (const declared of kernel.declared ?? []) {
      if (declared.env_id === envId) {
        const where = kernel.path || `kernel ${kernel.kernel_id.slice(0, 8)}`;
        names.push(`${declared.name ?? DEFAULT_TITLE} · ${where}`);
      }
    }
  }
  return names;
}
