import { describe, expect, it } from 'vitest';

import { CLUSTER_LOG_LINES, ClusterKernels, KERNEL_SCHEMA } from '../src/clusterKernels';
import { IEmission, ITransport, RuntimeEnvModel } from '../src/model';

const NODE = 'tcp://10.0.0.7:40123';

function ev(kind: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { kind, kernel_id: 'k1', node: NODE, scheduler: 'tcp://s:8786', ...extra };
}

describe('ClusterKernels', () => {
  it('follows a start from placing to running, naming the node', () => {
    const kernels = new ClusterKernels();
    kernels.apply(ev('placing', { node: '', message: 'connecting to the Dask scheduler' }));
    expect(kernels.list()[0]).toMatchObject({ phase: 'starting', node: '' });
    kernels.apply(ev('placed', { message: `placed on Dask worker ${NODE}` }));
    kernels.apply(ev('state', { state: 'BUILDING', env_id: 'e' }));
    kernels.apply(ev('step', { step: 'pip:x', status: 'running', label: 'pip: alpha==1.0' }));
    kernels.apply(ev('log', { step: 'pip:x', lines: ['Resolved 1 package'] }));
    let kernel = kernels.list()[0];
    expect(kernel.node).toBe(NODE);
    expect(kernel.state).toBe('BUILDING');
    expect(kernel.steps['pip:x']).toEqual({ label: 'pip: alpha==1.0', status: 'running' });
    expect(kernel.log).toEqual(['Resolved 1 package']);
    kernels.apply(ev('started', { pid: 42, message: `kernel started on Dask worker ${NODE}` }));
    kernel = kernels.list()[0];
    expect(kernel.phase).toBe('running');
    expect(kernel.pid).toBe(42);
  });

  it('keeps the last installer lines only', () => {
    const kernels = new ClusterKernels();
    const lines = Array.from({ length: 50 }, (_, i) => `line ${i}`);
    kernels.apply(ev('log', { lines }));
    expect(kernels.list()[0].log).toEqual(lines.slice(-CLUSTER_LOG_LINES));
  });

  it('shows a failure or a lost node until dismissed, and forgets a stopped kernel', () => {
    const kernels = new ClusterKernels();
    kernels.apply(ev('failed', { message: `building failed on Dask worker ${NODE}: pip: boom` }));
    kernels.apply(ev('started', { kernel_id: 'k2' }));
    kernels.apply(ev('lost', { kernel_id: 'k2', message: `kernel k2 is dead: its Dask worker ${NODE} left` }));
    expect(kernels.list().map(k => [k.kernel_id, k.phase])).toEqual([
      ['k1', 'failed'],
      ['k2', 'dead']
    ]);
    expect(kernels.dismiss('k1')).toBe(true);
    kernels.apply(ev('started', { kernel_id: 'k3' }));
    kernels.apply(ev('exited', { kernel_id: 'k3', code: 0 })); // asked for: no message
    expect(kernels.kernels.get('k3')?.phase).toBe('running');
    kernels.apply(ev('stopped', { kernel_id: 'k3' }));
    expect(kernels.kernels.has('k3')).toBe(false);
  });

  it('keeps the failure line when the node\'s last build events arrive after it', () => {
    const kernels = new ClusterKernels();
    kernels.apply(ev('failed', { message: 'building failed on Dask worker X: pip: boom' }));
    kernels.apply(ev('step', { step: 'pip:x', status: 'failed', message: 'on Dask worker X: pip: failed' }));
    expect(kernels.list()[0].message).toBe('building failed on Dask worker X: pip: boom');
    expect(kernels.list()[0].steps['pip:x'].status).toBe('failed');
  });

  it('starts afresh when a restart places the kernel again', () => {
    const kernels = new ClusterKernels();
    kernels.apply(ev('step', { step: 's', status: 'done' }));
    kernels.apply(ev('started'));
    kernels.apply(ev('placing', { message: 'connecting' }));
    expect(kernels.list()[0]).toMatchObject({ phase: 'starting', steps: {}, log: [] });
  });

  it('ignores events without a kernel or kind', () => {
    const kernels = new ClusterKernels();
    expect(kernels.apply({ kind: 'placed' })).toBe(false);
    expect(kernels.apply({ kernel_id: 'k' })).toBe(false);
    expect(kernels.list()).toEqual([]);
  });
});

describe('the model', () => {
  it('takes the kernel events of the stream and tells its views', () => {
    let push: (event: IEmission) => void = () => undefined;
    const transport: ITransport = {
      request: async () => ({ envs: [], kernels: [] }) as any,
      subscribe(onEvent) {
        push = onEvent;
        return { dispose: () => undefined };
      }
    };
    const model = new RuntimeEnvModel({ transport });
    void model.start();
    let changes = 0;
    model.changed.connect(() => changes++);
    push({ schema_id: KERNEL_SCHEMA, ...ev('placed') });
    expect(changes).toBe(1);
    expect(model.clusterKernels.list()[0].node).toBe(NODE);
    model.dispose();
  });
});
