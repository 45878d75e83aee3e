/**
 * A notebook's carried environments as text and code, without a DOM (unit-tested): what the
 * badge says, its tooltip, and the Python its Declare button runs in the kernel.
 */
import type { INotebookEnv, INotebookEnvStatus } from './model';

/** Python run in the kernel by the badge's button: declares the default and every named
 * env the notebook carries (``notebook_meta.declare``). */
export function declareCode(meta: INotebookEnv): string {
  const named: Record<string, unknown> = {};
  for (const [name, entry] of Object.entries(meta.named ?? {})) {
    named[name] = entry.spec;
  }
  const spec = JSON.stringify(JSON.stringify(meta.spec ?? null));
  const names = JSON.stringify(JSON.stringify(named));
  return (
    'import json as _jre_json\n' +
    'from jupyter_runtimeenv.notebook_meta import declare as _jre_declare\n' +
    `_jre_declare(_jre_json.loads(${spec}), named=_jre_json.loads(${names}))\n` +
    'del _jre_json, _jre_declare'
  );
}

/** The badge's tooltip: each env the notebook carries, its id here and its state. */
export function badgeTitle(status: INotebookEnvStatus): string {
  const rows = [...(status.default ? [status.default] : []), ...(status.named ?? [])];
  const lines = rows.map(row => {
    const name = row.name ?? '(default)';
    const id = row.env_id ? ` ${row.env_id.slice(0, 12)}` : '';
    const state = row.state === 'missing' ? 'not built on this server' : row.state;
    return `${name}${id}: ${state}`;
  });
  return ['This notebook carries its environments:', ...lines].join('\n');
}

/** The badge's text: the worst state of all, and how many named envs come with it. */
export function badgeText(status: INotebookEnvStatus): string {
  const named = status.named?.length ?? 0;
  return `env: ${status.state}` + (named ? ` (+${named} named)` : '');
}
