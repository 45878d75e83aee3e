/**
 * Kernels on a Dask cluster, as the sidebar shows them: where each one is (its node), what
 * its start is doing (placing, staging, building the env on the node with its steps and
 * installer lines, starting), and why it failed or died. State comes only from the server's
 * event stream (schema ``KERNEL_SCHEMA``, emitted by the Dask kernel provisioner); the
 * ``ClusterKernels`` state is plain data (unit-tested without a DOM), ``clusterKernelsView.tsx``
 * draws it.
 */

export const KERNEL_SCHEMA =
  'https://events.jupyter.org/jupyter_runtimeenv/kernel/v1';

/** Lines of installer output kept per kernel. */
export const CLUSTER_LOG_LINES = 20;

export interface IClusterKernel {
  kernel_id: string;
  /** The Dask worker's address ('' before one is picked). */
  node: string;
  scheduler: string;
  /** ``starting`` (placing, staging, building), ``running``, ``failed`` or ``dead``. */
  phase: 'starting' | 'running' | 'failed' | 'dead';
  /** The last line for people (the event's message). */
  message: string;
  /** The env's state on the node, once known. */
  state: string;
  steps: Record<string, { label: string; status: string }>;
  log: string[];
  pid: number | null;
}

/** Kinds after which the kernel is no longer shown (it was shut down). */
const GONE = new Set(['stopped']);

export class ClusterKernels {
  readonly kernels = new Map<string, IClusterKernel>();

  /** Apply one event of ``KERNEL_SCHEMA``; whether anything changed. */
  apply(event: Record<string, unknown>): boolean {
    const id = String(event.kernel_id ?? '');
    const kind = String(event.kind ?? '');
    if (!id || !kind) {
      return false;
    }
    if (GONE.has(kind)) {
      return this.kernels.delete(id);
    }
    const known = this.kernels.get(id);
    const kernel: IClusterKernel = known ?? {
      kernel_id: id,
      node: '',
      scheduler: '',
      phase: 'starting',
      message: '',
      state: '',
      steps: {},
      log: [],
      pid: null
    };
    kernel.node = String(event.node ?? '') || kernel.node;
    kernel.scheduler = String(event.scheduler ?? '') || kernel.scheduler;
    // A failure's line stays (build events relayed from the node may arrive after it).
    const final = kernel.phase === 'failed' || kernel.phase === 'dead';
    if (typeof event.message === 'string' && event.message && (!final || kind === 'placing')) {
      kernel.message = event.message;
    }
    switch (kind) {
      case 'placing':
        // A (re)start: forget what the previous run showed.
        kernel.phase = 'starting';
        kernel.steps = {};
        kernel.log = [];
        kernel.state = '';
        break;
      case 'state':
        kernel.state = String(event.state ?? kernel.state);
        break;
      case 'step': {
        const step = String(event.step ?? '');
        kernel.steps = {
          ...kernel.steps,
          [step]: {
            label: String(event.label ?? '') || step,
            status: String(event.status ?? '')
          }
        };
        break;
      }
      case 'log': {
        const lines = Array.isArray(event.lines) ? event.lines.map(String) : [];
        kernel.log = kernel.log.concat(lines).slice(-CLUSTER_LOG_LINES);
        break;
      }
      case 'started':
        kernel.phase = 'running';
        kernel.pid = typeof event.pid === 'number' ? event.pid : kernel.pid;
        break;
      case 'failed':
        kernel.phase = 'failed';
        break;
      case 'lost':
        kernel.phase = 'dead';
        break;
      case 'exited':
        // A death the server's restarter may undo (a new 'placing' then follows).
        if (kernel.message && kernel.phase === 'running') {
          kernel.phase = 'dead';
        }
        break;
      default:
        break;
    }
    this.kernels.set(id, kernel);
    return true;
  }

  /** Dismiss a failed or dead kernel's entry. */
  dismiss(kernelId: string): boolean {
    return this.kernels.delete(kernelId);
  }

  /** Starting ones first, then running, then failed and dead; by kernel id within. */
  list(): IClusterKernel[] {
    const order = { starting: 0, running: 1, failed: 2, dead: 3 };
    return Array.from(this.kernels.values()).sort(
      (a, b) =>
        order[a.phase] - order[b.phase] || a.kernel_id.localeCompare(b.kernel_id)
    );
  }
}
