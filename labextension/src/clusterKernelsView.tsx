/**
 * "Kernels on a cluster" (React): each kernel started on a Dask node from a ``--dask``
 * kernelspec, named by its notebook, with its node and phase; while it starts, the env's
 * build on that node (steps and installer lines); a failed start or a lost node in one line
 * that stays until dismissed. The state is ``ClusterKernels`` (``clusterKernels.ts``).
 */
import * as React from 'react';

import { LogBox } from './card';
import type { IClusterKernel } from './clusterKernels';

export function ClusterKernelsView(props: {
  kernels: IClusterKernel[];
  label: (kernelId: string) => string;
  onDismiss: (kernelId: string) => void;
}): JSX.Element | null {
  if (!props.kernels.length) {
    return null;
  }
  return (
    <div className="jp-RuntimeEnv-clusterKernels">
      <div className="jp-RuntimeEnv-sectionTitle">Kernels on a cluster</div>
      {props.kernels.map(kernel => {
        const ended = kernel.phase === 'failed' || kernel.phase === 'dead';
        const steps = Object.entries(kernel.steps);
        return (
          <div
            key={kernel.kernel_id}
            className={`jp-RuntimeEnv-card jp-RuntimeEnv-clusterKernel jp-mod-${kernel.phase}`}
            data-kernel-id={kernel.kernel_id}
            data-phase={kernel.phase}
            data-node={kernel.node}
          >
            <div className="jp-RuntimeEnv-row">
              <span className="jp-RuntimeEnv-id">{props.label(kernel.kernel_id)}</span>
              <span className={`jp-RuntimeEnv-state jp-mod-${kernel.phase}`}>{kernel.phase}</span>
              <span className="jp-RuntimeEnv-meta jp-RuntimeEnv-node">
                {kernel.node || kernel.scheduler}
              </span>
              {ended && (
                <button
                  type="button"
                  className="jp-RuntimeEnv-button"
                  title="Dismiss"
                  onClick={() => props.onDismiss(kernel.kernel_id)}
                >
                  ×
                </button>
              )}
            </div>
            {kernel.message && (
              <div className={ended ? 'jp-RuntimeEnv-error' : 'jp-RuntimeEnv-brief'}>
                {kernel.message}
              </div>
            )}
            {kernel.phase !== 'running' && steps.length > 0 && (
              <ul className="jp-RuntimeEnv-steps">
                {steps.map(([name, step]) => (
                  <li
                    key={name}
                    className={`jp-RuntimeEnv-step jp-mod-${step.status}`}
                    title={name}
                  >
                    <span className="jp-RuntimeEnv-stepName">{step.label}</span>
                    <span className="jp-RuntimeEnv-stepStatus">{step.status}</span>
                  </li>
                ))}
              </ul>
            )}
            {kernel.phase !== 'running' && kernel.log.length > 0 && <LogBox lines={kernel.log} />}
          </div>
        );
      })}
    </div>
  );
}
