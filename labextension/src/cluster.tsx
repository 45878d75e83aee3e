/**
 * A kernel's Dask cluster under its notebook (React): the scheduler and its dashboard, each
 * node with its cache use, and per node the kernel's environments there with their state,
 * size and workers (Stop goes through the kernel's executor); GC collects the nodes' caches.
 */
import { LabIcon, launchIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

import { ActionButton, WorkerRow } from './card';
import { formatBytes } from './format';
import type { ICluster, IEnvWorker, INode, IWorker } from './model';

export interface IClusterActions {
  stopWorker(worker: IEnvWorker, node: string): void;
  gc(): void;
  /** The title the kernel knows an env id by (``(default)``, a name), if any. */
  titleOf(envId: string): string | null;
}

function host(address: string): string {
  return address.replace(/^[a-z]+:\/\//, '');
}

function NodeView(props: {
  node: INode;
  kernelId: string;
  kernelLabel: string;
  now: number;
  actions: IClusterActions;
}): JSX.Element {
  const { node, now, actions } = props;
  const up = node.state === 'up';
  return (
    <div className="jp-RuntimeEnv-clusterNode" data-node={node.address}>
      <div className="jp-RuntimeEnv-row">
        <span className="jp-RuntimeEnv-nodeName" title={node.address}>
          {node.name ? `${node.name} · ` : ''}
          {host(node.address)}
        </span>
        <span className={`jp-RuntimeEnv-nodeState ${up ? 'jp-mod-up' : 'jp-mod-down'}`}>
          {node.state}
        </span>
        <span className="jp-RuntimeEnv-spacer" />
        <span className="jp-RuntimeEnv-meta" title="the node's cache: used / budget">
          {formatBytes(node.cache_bytes)} / {formatBytes(node.max_bytes)}
        </span>
      </div>
      {node.error && <div className="jp-RuntimeEnv-error">{node.error}</div>}
      {node.envs.map(env => {
        const title = actions.titleOf(env.driver_env_id);
        return (
          <div
            key={env.env_id}
            className={`jp-RuntimeEnv-nodeEnv jp-mod-${env.state.toLowerCase()}`}
            data-env-id={env.driver_env_id}
          >
            <div className="jp-RuntimeEnv-row">
              <span className="jp-RuntimeEnv-name">{title ?? env.driver_env_id.slice(0, 12)}</span>
              <span className={`jp-RuntimeEnv-state jp-mod-${env.state.toLowerCase()}`}>
                {env.state}
              </span>
              <span className="jp-RuntimeEnv-spacer" />
              <span className="jp-RuntimeEnv-meta">{formatBytes(env.bytes)}</span>
            </div>
            {env.workers.map((worker: IWorker) => {
              const shown: IEnvWorker = {
                ...worker,
                kernel_id: props.kernelId,
                kernel_label: props.kernelLabel
              };
              return (
                <WorkerRow
                  key={worker.pid}
                  worker={shown}
                  now={now}
                  where={host(node.address)}
                  onStop={() => actions.stopWorker(shown, node.address)}
                />
              );
            })}
          </div>
        );
      })}
    </div>
  );
}

export function ClusterSection(props: {
  cluster: ICluster;
  kernelId: string;
  kernelLabel: string;
  now: number;
  actions: IClusterActions;
}): JSX.Element {
  const { cluster } = props;
  const up = cluster.nodes.filter(n => n.state === 'up').length;
  const Launch: LabIcon = launchIcon;
  return (
    <div className="jp-RuntimeEnv-daskCluster" data-scheduler={cluster.scheduler}>
      <div className="jp-RuntimeEnv-row jp-RuntimeEnv-clusterHead">
        <span className="jp-RuntimeEnv-label">Dask cluster</span>
        <span className="jp-RuntimeEnv-clusterAddress" title={cluster.scheduler}>
          {host(cluster.scheduler)}
        </span>
        <span className="jp-RuntimeEnv-meta">
          {up}/{cluster.nodes.length} nodes up
        </span>
        <span className="jp-RuntimeEnv-spacer" />
        {cluster.dashboard && (
          <a
            className="jp-RuntimeEnv-link"
            href={cluster.dashboard}
            target="_blank"
            rel="noopener noreferrer"
            title="Dask's dashboard (a new browser tab)"
          >
            <Launch.react tag="span" className="jp-RuntimeEnv-buttonIcon" />
            dashboard
          </a>
        )}
        <ActionButton
          label="GC"
          title="Collect the environments nobody holds on every node of this cluster"
          onClick={props.actions.gc}
        />
      </div>
      {cluster.nodes.map(node => (
        <NodeView
          key={node.address}
          node={node}
          kernelId={props.kernelId}
          kernelLabel={props.kernelLabel}
          now={props.now}
          actions={props.actions}
        />
      ))}
    </div>
  );
}
