import { describe, expect, it } from 'vitest';

import { isNotebookEnv } from '../src/model';
import { badgeText, badgeTitle, declareCode } from '../src/notebookEnv';

const ID = 'a'.repeat(64);
const SLOW = 'b'.repeat(64);

describe('a notebook that carries its envs', () => {
  it('is a default, named envs, or both', () => {
    expect(isNotebookEnv({ version: 1, spec: { env_vars: { A: '1' } } })).toBe(true);
    expect(isNotebookEnv({ version: 1, named: { slow: { spec: {} } } })).toBe(true);
    expect(isNotebookEnv({ version: 1, named: {} })).toBe(false);
    expect(isNotebookEnv({ version: 1, spec: null })).toBe(false);
    expect(isNotebookEnv({ version: 1, spec: [] })).toBe(false);
    expect(isNotebookEnv('spec')).toBe(false);
  });

  it('declares the default and every named env, as JSON Python reads', () => {
    const code = declareCode({
      version: 1,
      spec: { env_vars: { Q: 'say "hi"\n' } },
      named: { slow: { spec: { env_vars: { SPEED: 'slow' } }, env_id: SLOW } }
    });
    const line = code.split('\n')[2];
    expect(line).toBe(
      '_jre_declare(_jre_json.loads("{\\"env_vars\\":{\\"Q\\":\\"say \\\\\\"hi\\\\\\"\\\\n\\"}}"), ' +
        'named=_jre_json.loads("{\\"slow\\":{\\"env_vars\\":{\\"SPEED\\":\\"slow\\"}}}"))'
    );
    // Only named envs: the default is None, not an empty spec.
    expect(declareCode({ version: 1, named: { x: { spec: {} } } })).toContain(
      '_jre_declare(_jre_json.loads("null"), named=_jre_json.loads("{\\"x\\":{}}"))'
    );
  });

  it('says the worst state, how many named envs, and each id it has here', () => {
    const status = {
      state: 'missing' as const,
      env_id: ID,
      default: { name: null, state: 'cached' as const, env_id: ID },
      named: [{ name: 'slow', state: 'missing' as const, env_id: null }]
    };
    expect(badgeText(status)).toBe('env: missing (+1 named)');
    expect(badgeTitle(status).split('\n')).toEqual([
      'This notebook carries its environments:',
      `(default) ${ID.slice(0, 12)}: cached`,
      'slow: not built on this server'
    ]);
    expect(badgeText({ state: 'cached', default: status.default })).toBe('env: cached');
  });
});
