import { describe, expect, it } from 'vitest';

import {
  failedStep,
  formatAge,
  formatBytes,
  formatDuration,
  gcKept,
  gcStay,
  portableSpec,
  requirement,
  requirementName,
  specBrief,
  specToYaml
} from '../src/format';
import {
  ENV_SCHEMA,
  IEmission,
  IOverview,
  ITransport,
  RuntimeEnvModel,
  WORKERS_SCHEMA
} from '../src/model';

const ID = 'a'.repeat(64);
const OTHER = 'b'.repeat(64);

function overview(state = 'BUILDING'): IOverview {
  return {
    envs: [
      {
        env_id: ID,
        state,
        spec: { pip: { packages: ['numpy==1.26'] } },
        error: null,
        steps: {},
        created: 100,
        last_used: 200,
        size: 2_500_000,
        holders: [{ id: 'kernel:k1/pool:1', label: 'a.ipynb (workers)', kind: 'kernel' }]
      }
    ],
    kernels: []
  };
}

/** A fake server: answers from a table, records requests, lets the test push events. */
class FakeTransport implements ITransport {
  requests: Array<[string, string, unknown]> = [];
  answers: Record<string, unknown> = {};
  failing = false;
  onEvent: (e: IEmission) => void = () => undefined;
  onState: (c: boolean) => void = () => undefined;
  async request<T>(method: string, path: string, body?: unknown): Promise<T> {
    this.requests.push([method, path, body]);
    if (this.failing) {
      throw new Error('connection refused');
    }
    return this.answers[`${method} ${path}`] as T;
  }
  subscribe(onEvent: (e: IEmission) => void, onState: (c: boolean) => void) {
    this.onEvent = onEvent;
    this.onState = onState;
    return { dispose: () => undefined };
  }
}

/** Timers the test fires by hand. */
class Timers {
  pending: Array<{ fn: () => void; ms: number }> = [];
  set = (fn: () => void, ms: number) => {
    const t = { fn, ms };
    this.pending.push(t);
    return t;
  };
  clear = (t: unknown) => {
    this.pending = this.pending.filter(p => p !== t);
  };
  async fireAll(): Promise<void> {
    const due = this.pending;
    this.pending = [];
    for (const t of due) {
      t.fn();
    }
    await new Promise(r => setTimeout(r, 0));
  }
}

function setup(state = 'BUILDING') {
  const transport = new FakeTransport();
  transport.answers['GET overview'] = overview(state);
  const timers = new Timers();
  const model = new RuntimeEnvModel({
    transport,
    pollInterval: 7,
    setTimer: timers.set,
    clearTimer: timers.clear
  });
  return { transport, timers, model };
}

describe('RuntimeEnvModel', () => {
  it('loads the overview and emits changed', async () => {
    const { model } = setup();
    let changes = 0;
    model.changed.connect(() => changes++);
    await model.start();
    expect(model.loaded).toBe(true);
    expect(model.envs.get(ID)?.size).toBe(2_500_000);
    expect(changes).toBe(1);
  });

  it('applies step and log events live, and a state event then refetches once', async () => {
    const { model, transport, timers } = setup();
    await model.start();
    transport.onState(true);
    await timers.fireAll(); // the refresh on connect ran already
    transport.requests = [];
    transport.onEvent({ schema_id: ENV_SCHEMA, kind: 'step', env_id: ID, step: 'pip:x', status: 'running', info: { started: 1 } });
    transport.onEvent({ schema_id: ENV_SCHEMA, kind: 'log', env_id: ID, step: 'pip:x', lines: ['Resolved 1 package'] });
    const env = model.envs.get(ID)!;
    expect(env.steps['pip:x']).toEqual({ started: 1, status: 'running' });
    expect(env.log).toEqual(['Resolved 1 package']);
    expect(transport.requests).toEqual([]); // no polling while the socket is up
    transport.answers['GET overview'] = overview('READY');
    transport.onEvent({ schema_id: ENV_SCHEMA, kind: 'state', env_id: ID, state: 'READY', old: 'BUILDING' });
    transport.onEvent({ schema_id: ENV_SCHEMA, kind: 'state', env_id: ID, state: 'READY', old: 'READY' });
    expect(model.envs.get(ID)?.state).toBe('READY');
    await timers.fireAll();
    expect(transport.requests.filter(r => r[1] === 'overview')).toHaveLength(1);
    expect(model.envs.get(ID)?.log).toEqual(['Resolved 1 package']); // kept across refetch
  });

  it('keeps only the last log lines', async () => {
    const { model, transport } = setup();
    await model.start();
    const lines = Array.from({ length: 100 }, (_, i) => `line ${i}`);
    transport.onEvent({ schema_id: ENV_SCHEMA, kind: 'log', env_id: ID, step: 's', lines });
    expect(model.envs.get(ID)!.log).toHaveLength(40);
    expect(model.envs.get(ID)!.log[39]).toBe('line 99');
  });

  it('records a failure with its error and removes removed envs', async () => {
    const { model, transport } = setup();
    await model.start();
    const error = { step: 'pip:abc', message: 'no matching distribution', output_tail: 'ERROR: x' };
    transport.onEvent({ schema_id: ENV_SCHEMA, kind: 'state', env_id: ID, state: 'FAILED', error });
    expect(model.envs.get(ID)?.state).toBe('FAILED');
    expect(failedStep(model.envs.get(ID)!)).toBe('pip:abc');
    transport.onEvent({ schema_id: ENV_SCHEMA, kind: 'state', env_id: ID, state: 'PENDING', removed: true });
    expect(model.envs.has(ID)).toBe(false);
  });

  it('polls only while the socket is down', async () => {
    const { model, transport, timers } = setup();
    await model.start();
    transport.onState(true);
    await timers.fireAll();
    expect(timers.pending).toHaveLength(0);
    transport.onState(false);
    expect(timers.pending.map(t => t.ms)).toEqual([7000]);
    transport.requests = [];
    await timers.fireAll();
    expect(transport.requests.map(r => r[1])).toEqual(['overview']);
    expect(timers.pending.map(t => t.ms)).toEqual([7000]); // polls again
    transport.onState(true);
    expect(timers.pending).toHaveLength(0); // the poll timer is cancelled
  });

  it('applies only the newest of overlapping refreshes', async () => {
    const { model, transport } = setup('READY');
    const answers: Array<(v: IOverview) => void> = [];
    transport.request = <T>() => new Promise<T>(resolve => answers.push(resolve as any));
    const first = model.refresh();
    const second = model.refresh();
    answers[1](overview('READY'));
    await second;
    answers[0](overview('BUILDING')); // the older answer arrives last
    await first;
    expect(model.envs.get(ID)?.state).toBe('READY');
  });

  it('says when the server cannot be reached', async () => {
    const { model, transport } = setup();
    transport.failing = true;
    await model.start();
    expect(model.error).toMatch(/cannot reach.*connection refused/);
  });

  it('marks what it holds as the last word of a server that does not answer', async () => {
    const { model, transport } = setup('READY');
    await model.start();
    transport.onState(true);
    expect(model.unreachableSince).toBeNull();
    transport.failing = true; // the server stopped: the stream closes, requests fail
    transport.requests = [];
    transport.onState(false);
    expect(transport.requests.map(r => r[1])).toEqual(['overview']); // asked at once
    await new Promise(r => setTimeout(r, 0));
    const since = model.unreachableSince;
    expect(since).toBeGreaterThan(0);
    expect(model.envs.get(ID)?.state).toBe('READY'); // kept, as its last word
    await model.refresh();
    expect(model.unreachableSince).toBe(since); // since the first failure
    transport.failing = false;
    await model.refresh();
    expect(model.unreachableSince).toBeNull();
  });

  it('does not call a server that answers with an error unreachable', async () => {
    const { model, transport } = setup('READY');
    transport.request = async () => {
      throw Object.assign(new Error('Internal Server Error'), { status: 500 });
    };
    await model.start();
    expect(model.error).toMatch(/Internal Server Error/);
    expect(model.unreachableSince).toBeNull();
  });

  it('shows workers under their env, and forgets a kernel that is gone', async () => {
    const { model, transport } = setup('READY');
    await model.start();
    const pools = [
      { env_id: ID, name: 'p', state: 'ready', max_workers: 2, workers: [{ pid: 42, busy: true, tasks_done: 3, tasks_failed: 1, rss: 1000 }] },
      { env_id: OTHER, name: 'q', state: 'ready', max_workers: 2, workers: [{ pid: 43, busy: false, tasks_done: 0, tasks_failed: 0, rss: null }] }
    ];
    transport.onEvent({ schema_id: WORKERS_SCHEMA, kind: 'report', kernel_id: 'k1', pools });
    const workers = model.workersOf(ID);
    expect(workers.map(w => [w.pid, w.busy, w.kernel_id])).toEqual([[42, true, 'k1']]);
    expect(workers[0].kernel_label).toBe('kernel k1');
    transport.onEvent({ schema_id: WORKERS_SCHEMA, kind: 'gone', kernel_id: 'k1', pools: [] });
    expect(model.workersOf(ID)).toEqual([]);
  });

  it('sends the actions to the right endpoints and reports what GC did', async () => {
    const { model, transport } = setup('READY');
    transport.answers['GET gc/unreferenced'] = { envs: [{ env_id: ID, state: 'READY', bytes: 9, last_used: 1, fields: [] }], bytes: 9, held: 2 };
    transport.answers['POST gc/unreferenced'] = { removed: [ID], kept: [], freed_bytes: 1234 };
    transport.answers[`DELETE envs/${ID}?force=true`] = { removed: ['u'] };
    transport.answers['POST kernels/k1/gc'] = { nodes: { 'tcp://n:1': 5 }, freed_bytes: 5 };
    await model.start();
    expect((await model.gcPlan()).envs.map(e => e.env_id)).toEqual([ID]);
    expect((await model.gc([ID])).freed_bytes).toBe(1234);
    expect(await model.remove(ID, true)).toEqual(['u']);
    await model.rebuild(ID);
    await model.stopWorker('k1', 42);
    await model.stopWorker('k1', 43, 'tcp://10.0.0.7:4000');
    await model.release(ID);
    expect((await model.clusterGc('k1')).freed_bytes).toBe(5);
    const calls = transport.requests.map(r => `${r[0]} ${r[1]}`).filter(c => !c.endsWith('overview'));
    expect(calls).toEqual([
      'GET gc/unreferenced',
      'POST gc/unreferenced',
      `DELETE envs/${ID}?force=true`,
      `POST envs/${ID}/rebuild`,
      'DELETE kernels/k1/workers/42',
      'DELETE kernels/k1/workers/43?node=tcp%3A%2F%2F10.0.0.7%3A4000',
      `DELETE envs/${ID}/holders/user`,
      'POST kernels/k1/gc'
    ]);
    const gcBody = transport.requests.find(r => r[0] === 'POST' && r[1] === 'gc/unreferenced');
    expect(gcBody![2]).toEqual({ env_ids: [ID] });
  });

  it('refetches the overview when holders change, once per burst', async () => {
    const { model, transport, timers } = setup('READY');
    await model.start();
    transport.onState(true);
    await timers.fireAll();
    transport.requests = [];
    transport.onEvent({ schema_id: ENV_SCHEMA, kind: 'holders', env_id: ID });
    transport.onEvent({ schema_id: ENV_SCHEMA, kind: 'holders', env_id: ID });
    await timers.fireAll();
    expect(transport.requests.filter(r => r[1] === 'overview')).toHaveLength(1);
  });

  it('waits for the end of a build', async () => {
    const { model, transport } = setup('BUILDING');
    await model.start();
    const ended = model.waitForEnd(ID);
    transport.onEvent({ schema_id: ENV_SCHEMA, kind: 'state', env_id: ID, state: 'FAILED', error: { message: 'no' } });
    const env = await ended;
    expect(env?.state).toBe('FAILED');
    expect(await model.waitForEnd('nope')).toBeNull();
  });

  it('fetches the spec of an env the overview gave without one', async () => {
    const { model, transport } = setup('READY');
    await model.start();
    model.envs.get(ID)!.spec = null;
    transport.answers[`GET envs/${ID}`] = { spec: { env_vars: { A: '1' } } };
    expect(await model.specOf(ID)).toEqual({ env_vars: { A: '1' } });
  });

  it('sorts building envs first, then by last use', async () => {
    const { model } = setup();
    model.applyOverview({
      envs: [
        { ...overview('READY').envs[0], env_id: 'old', last_used: 1 },
        { ...overview('READY').envs[0], env_id: 'new', last_used: 9 },
        { ...overview('BUILDING').envs[0], env_id: 'b', last_used: 0 }
      ],
      kernels: []
    });
    expect(model.sortedEnvs().map(e => e.env_id)).toEqual(['b', 'new', 'old']);
  });
});

describe('formatting', () => {
  it('briefs a spec', () => {
    expect(
      specBrief({
        pip: { packages: ['numpy>=1', 'pandas[excel]==2.0'] },
        working_dir: '/home/u/proj/data',
        env_vars: { A: '1', B: '2' },
        driver_python: '/usr/bin/python3',
        config: {}
      })
    ).toBe('pip: numpy>=1, pandas[excel]==2.0 · working_dir: data/ · env_vars: 2');
    expect(specBrief({ pip: ['a==1', 'b==2', 'c', 'd', 'e', 'f'] })).toBe(
      'pip: a==1, b==2, c, d +2 more'
    );
    expect(specBrief({ config: {} })).toMatch(/no packages/);
    expect(specBrief(null, ['driver_python', 'pip', 'working_dir'])).toBe('pip · working_dir');
  });

  it('names requirements', () => {
    expect(requirement('  numpy ==  1.26 ')).toBe('numpy == 1.26');
    expect(requirement('pkg @ file:///home/u/pkg')).toBe('pkg');
    expect(requirement('/wheels/six-1.0-py3-none-any.whl')).toBe('six-1.0-py3-none-any.whl');
    expect(requirementName('requests==2.*')).toBe('requests');
    expect(requirementName('/wheels/six-1.0-py3-none-any.whl')).toBe('six-1.0-py3-none-any.whl');
  });

  it('formats bytes and ages', () => {
    expect(formatBytes(null)).toBe('–');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(2_500_000)).toBe('2.5 MB');
    expect(formatBytes(250_000_000)).toBe('250 MB');
    expect(formatAge(100, 130)).toBe('30 s');
    expect(formatAge(0, 130)).toBe('–');
    expect(formatAge(100, 100 + 7200)).toBe('2 h');
    expect(formatDuration(90)).toBe('2 min');
  });

  it('names a failed step by its label', () => {
    const env = {
      env_id: ID,
      state: 'FAILED',
      spec: null,
      error: { step: 'pip', message: 'boom' },
      steps: { 'pip pip:2bec30': { status: 'failed', label: 'pip: numpy==9.9' } },
      created: 1,
      last_used: 1,
      size: null,
      holders: [],
      log: []
    };
    expect(failedStep(env)).toBe('pip: numpy==9.9');
    env.error = { step: 'pip pip:2bec30', message: 'boom' };
    expect(failedStep(env)).toBe('pip: numpy==9.9');
  });

  it('copies a spec without the machine-specific fields', () => {
    expect(
      portableSpec({ pip: ['six'], driver_python: '/x/python', driver_sys_path: ['/x'] })
    ).toEqual({ pip: ['six'] });
  });

  it('writes a spec as YAML', () => {
    expect(
      specToYaml({ pip: ['six', 'a b'], env_vars: { MODE: 'true' }, excludes: [] })
    ).toBe('pip:\n  - six\n  - a b\nenv_vars:\n  MODE: "true"\nexcludes: []\n');
    expect(specToYaml({ pip: ['>=1', '-e x', 'a: b'] })).toBe(
      'pip:\n  - ">=1"\n  - "-e x"\n  - "a: b"\n'
    );
  });
});

describe('what GC leaves', () => {
  it('says it whole, building envs too', () => {
    expect(gcKept(1)).toBe('1 held environment');
    expect(`${gcKept(1)} ${gcStay(1)}`).toBe('1 held environment stays');
    expect(`${gcKept(2, 1)} ${gcStay(2, 1)}`).toBe('2 held and 1 building environments stay');
    expect(gcKept(0, 1)).toBe('1 building environment');
    expect(gcKept(0, 0)).toBe('');
  });
});
