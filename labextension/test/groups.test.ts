import { describe, expect, it } from 'vitest';

import { byRecentUse, declaredNames, groupEnvs } from '../src/groups';
import type { IEnv, IHolder, IKernelReport } from '../src/model';

const id = (c: string) => c.repeat(64);

function env(c: string, holders: IHolder[] = [], extra: Partial<IEnv> = {}): IEnv {
  return {
    env_id: id(c),
    state: 'READY',
    spec: { pip: { packages: [`pkg-${c}==1.0`] } },
    error: null,
    steps: {},
    created: 1,
    last_used: 10,
    size: 1000,
    holders,
    log: [],
    ...extra
  };
}

const kernelHolder = (k: string, rest: string, label: string): IHolder => ({
  id: `kernel:${k}${rest}`,
  label,
  kind: 'kernel',
  kernel_id: k
});

describe('groups', () => {
  it('groups envs by notebook, titled by their declared names, then the cache', () => {
    const envs = new Map<string, IEnv>([
      [id('a'), env('a', [kernelHolder('k1', '/runtime_env-magic:9:1', 'a.ipynb (%runtime_env)')])],
      [id('b'), env('b', [kernelHolder('k1', '/runtime_env-magic:9:2', 'a.ipynb (%runtime_env)')])],
      [id('c'), env('c', [], { last_used: 50 })],
      [id('d'), env('d', [{ id: 'cli', label: 'CLI', kind: 'cli' }], { last_used: 20 })],
      [id('e'), env('e', [kernelHolder('k2', '', 'b.ipynb')])]
    ]);
    const kernels = new Map<string, IKernelReport>([
      [
        'k1',
        {
          kernel_id: 'k1',
          path: 'a.ipynb',
          declared: [
            { name: null, env_id: id('a') },
            { name: 'slow', env_id: id('b') },
            { name: 'gone', env_id: id('f') }
          ],
          pools: [
            {
              env_id: id('a'),
              name: 'p',
              state: 'ready',
              max_workers: 2,
              workers: [{ pid: 7, busy: true, tasks_done: 1, tasks_failed: 0, rss: null }]
            }
          ]
        }
      ]
    ]);
    const groups = groupEnvs(envs, kernels);
    expect(groups.map(g => [g.kind, g.title])).toEqual([
      ['kernel', 'a.ipynb'],
      ['kernel', 'b.ipynb'], // known from its holder only (a kernel started in an env)
      ['cache', 'Cache']
    ]);
    const [a, b, cache] = groups;
    expect(a.entries.map(e => [e.title, e.named, e.env?.env_id ?? null])).toEqual([
      ['(default)', true, id('a')],
      ['slow', true, id('b')],
      ['gone', true, null] // declared, but not in the cache
    ]);
    expect(a.entries[0].workers.map(w => [w.pid, w.kernel_label])).toEqual([[7, 'a.ipynb']]);
    expect(a.bytes).toBe(2000);
    expect(b.entries.map(e => e.title)).toEqual(['kernel’s env']);
    // The rest, most recently used first, titled by their spec.
    expect(cache.entries.map(e => e.envId)).toEqual([id('c'), id('d')]);
    expect(cache.entries[0].title).toBe('pip: pkg-c==1.0');
    expect(new Set(groups.flatMap(g => g.entries.map(e => e.key))).size).toBe(6);
  });

  it('lists an env used by two notebooks under both, and names it for the cache', () => {
    const shared = env('a', [
      kernelHolder('k1', '/pool:1:1:x', 'a.ipynb (workers)'),
      kernelHolder('k2', '/pool:2:1:x', 'b.ipynb (workers)')
    ]);
    const envs = new Map([[id('a'), shared]]);
    const kernels = new Map<string, IKernelReport>([
      ['k1', { kernel_id: 'k1', path: 'a.ipynb', pools: [], declared: [{ name: 'x', env_id: id('a') }] }],
      ['k2', { kernel_id: 'k2', path: 'b.ipynb', pools: [] }]
    ]);
    const groups = groupEnvs(envs, kernels);
    expect(groups.map(g => [g.title, g.entries.map(e => e.title)])).toEqual([
      ['a.ipynb', ['x']],
      ['b.ipynb', ['pip: pkg-a==1.0']],
      ['Cache', []]
    ]);
    expect(declaredNames(kernels, id('a'))).toEqual(['x · a.ipynb']);
  });

  it("shows a kernel's cluster envs under its cluster, not as local cards", () => {
    const node = (address: string) => ({
      address,
      name: '0',
      state: 'up',
      cache_bytes: 1,
      max_bytes: 2,
      envs: [{ env_id: id('n'), driver_env_id: id('a'), state: 'READY', bytes: 1, workers: [] }]
    });
    const kernels = new Map<string, IKernelReport>([
      [
        'k1',
        {
          kernel_id: 'k1',
          path: 'dask.ipynb',
          pools: [],
          declared: [
            { name: null, env_id: id('a') },
            { name: 'local', env_id: id('b') }
          ],
          cluster: { scheduler: 'tcp://s:1', dashboard: null, nodes: [node('tcp://n:1')] }
        }
      ],
      [
        'k2',
        {
          kernel_id: 'k2',
          path: 'only.ipynb',
          pools: [],
          declared: [{ name: null, env_id: id('a') }],
          cluster: { scheduler: 'tcp://s:1', dashboard: null, nodes: [node('tcp://n:1')] }
        }
      ]
    ]);
    const groups = groupEnvs(new Map(), kernels);
    // The env on the nodes is left to the cluster section; one the nodes lack stays a card;
    // a kernel whose every env is on its cluster keeps its group (for the cluster section).
    expect(groups.map(g => [g.title, g.entries.map(e => e.title)])).toEqual([
      ['dask.ipynb', ['local']],
      ['only.ipynb', []],
      ['Cache', []]
    ]);
  });

  it('orders building and failed envs first, then by last use', () => {
    const envs = [
      env('a', [], { last_used: 5 }),
      env('b', [], { state: 'FAILED', last_used: 1 }),
      env('c', [], { state: 'BUILDING', last_used: 0 }),
      env('d', [], { last_used: 9 })
    ];
    expect(envs.sort(byRecentUse).map(e => e.env_id[0])).toEqual(['c', 'b', 'd', 'a']);
  });
});
