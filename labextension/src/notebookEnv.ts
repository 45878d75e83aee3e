/**
 * A notebook's carried environments as text and code, without a DOM (unit-tested): what the
 * badge says, its tooltip, and the Python its Declare button runs in the kernel.
 */
import type { INotebookEnv, INotebookEnvStatus } from './model';

/** Python run in the kernel by the badge's buttons: declares the default and every named
 * env the notebook carries (``notebook_meta.declare``), each pinned to the versions of its
 * saved lock, or with ``upgrade`` resolved anew. */
export function declareCode(meta: INotebookEnv, upgrade = false): string {
  const named: Record<string, unknown> = {};
  const locks: Record<string, string> = {};
  if (meta.lock) {
    locks[''] = meta.lock;
  }
  for (const [name, entry] of Object.entries(meta.named ?? {})) {
    named[name] = entry.spec;
    if (entry.lock) {
      locks[name] = entry.lock;
    }
  }
  const spec = JSON.stringify(JSON.stringify(meta.spec ?? null));
  const names = JSON.stringify(JSON.stringify(named));
  let rest = '';
  if (upgrade) {
    rest = ', upgrade=True';
  } else if (Object.keys(locks).length) {
    rest = `, locks=_jre_json.loads(${JSON.stringify(JSON.stringify(locks))})`;
  }
  return (
    'import json as _jre_json\n' +
    'from jupyter_runtimeenv.notebook_meta import declare as _jre_declare\n' +
    `_jre_declare(_jre_json.loads(${spec}), named=_jre_json.loads(${names})${rest})\n` +
    'del _jre_json, _jre_declare'
  );
}

/** Does the notebook carry a lock for any of its envs? */
export function hasLock(meta: INotebookEnv): boolean {
  return !!meta.lock || Object.values(meta.named ?? {}).some(entry => !!entry.lock);
}

/** The badge's tooltip: each env the notebook carries, its id here and its state. */
export function badgeTitle(status: INotebookEnvStatus): string {
  const rows = [...(status.default ? [status.default] : []), ...(status.named ?? [])];
  const lines = rows.map(row => {
    const name = row.name ?? '(default)';
    const id = row.env_id ? ` ${row.env_id.slice(0, 12)}` : '';
    const state = row.state === 'missing' ? 'not built on this server' : row.state;
    const lock = row.lock === 'matches' ? ', the lock\'s versions' : '';
    return `${name}${id}: ${state}${lock}`;
  });
  const differ = status.lock_differences ?? [];
  const diff = differ.length
    ? ['The running environments differ from the notebook\'s lock:', ...differ]
    : [];
  return ['This notebook carries its environments:', ...lines, ...diff].join('\n');
}

/** The badge's text: the worst state of all, and how many named envs come with it. */
export function badgeText(status: INotebookEnvStatus): string {
  const named = status.named?.length ?? 0;
  const differ = status.lock_differences?.length ?? 0;
  return (
    `env: ${status.state}` +
    (named ? ` (+${named} named)` : '') +
    (differ ? ` · lock differs (${differ})` : '')
  );
}
