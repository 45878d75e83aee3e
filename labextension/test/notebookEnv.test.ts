import { describe, expect, it } from 'vitest';

import { isNotebookEnv } from '../src/model';
import { badgeText, badgeTitle, declareCode, hasLock } from '../src/notebookEnv';

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

  it('declares each env pinned to its lock, or resolved anew with upgrade', () => {
    const meta = {
      version: 1,
      spec: { pip: ['alpha'] },
      lock: 'lock-version = "1.0"\n',
      named: { slow: { spec: {}, lock: 'L' }, fast: { spec: {} } }
    };
    expect(hasLock(meta)).toBe(true);
    expect(hasLock({ version: 1, named: { x: { spec: {} } } })).toBe(false);
    const line = declareCode(meta).split('\n')[2];
    expect(line).toContain(
      ', locks=_jre_json.loads("{\\"\\":\\"lock-version = \\\\\\"1.0\\\\\\"\\\\n\\",' +
        '\\"slow\\":\\"L\\"}"))'
    );
    expect(declareCode(meta, true).split('\n')[2]).toMatch(/, upgrade=True\)$/);
    expect(declareCode({ version: 1, spec: {} })).not.toContain('locks=');
  });

  it('says when the running envs differ from the lock, and how', () => {
    const status = {
      state: 'cached' as const,
      default: { name: null, state: 'cached' as const, env_id: ID, lock: 'differs' as const },
      named: [{ name: 'slow', state: 'cached' as const, env_id: SLOW, lock: 'matches' as const }],
      lock_differences: ['alpha: 1.0 in the lock, 2.0 in the env']
    };
    expect(badgeText(status)).toBe('env: cached (+1 named) · lock differs (1)');
    expect(badgeTitle(status).split('\n')).toEqual([
      'This notebook carries its environments:',
      `(default) ${ID.slice(0, 12)}: cached`,
      `slow ${SLOW.slice(0, 12)}: cached, the lock's versions`,
      "The running environments differ from the notebook's lock:",
      'alpha: 1.0 in the lock, 2.0 in the env'
    ]);
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
