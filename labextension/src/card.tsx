/**
 * One environment in the sidebar (React): its name first, state, size and last use; the spec
 * in brief with its pins and the id secondary; a build's steps and live output; a failure in
 * one line (expand for the steps, the output's tail and the actions); the workers of the
 * group's kernel in it, with what each runs and its CPU. Keyed by the panel, so a live update
 * keeps a card's expansion, its log box's scroll position and the focused button.
 */
import {
  LabIcon,
  caretDownIcon,
  caretRightIcon,
  copyIcon,
  deleteIcon,
  refreshIcon,
  stopIcon
} from '@jupyterlab/ui-components';
import * as React from 'react';

import {
  failedStep,
  firstLine,
  formatAge,
  formatBytes,
  formatDuration,
  outputTail,
  specBrief,
  stepLabel
} from './format';
import type { IEntry } from './groups';
import type { IEnv, IEnvWorker } from './model';

/** True while the server does not answer: the rows are what it said last (``was busy``),
 * shown greyed with their buttons disabled (the panel's ``fieldset``). */
export const StaleContext = React.createContext(false);

/** What a card can ask of the panel. */
export interface ICardActions {
  viewLog(envId: string): void;
  rebuild(env: IEnv): void;
  release(env: IEnv): void;
  remove(env: IEnv): void;
  copy(env: IEnv): void;
  stopWorker(worker: IEnvWorker): void;
}

/** A text button with an icon (the theme's styled button). */
export function ActionButton(props: {
  label: string;
  title: string;
  icon?: LabIcon;
  onClick: () => void;
  disabled?: boolean;
  warn?: boolean;
  className?: string;
}): JSX.Element {
  const classes = ['jp-RuntimeEnv-button', props.warn ? 'jp-mod-warn' : '', props.className ?? '']
    .filter(Boolean)
    .join(' ');
  return (
    <button
      type="button"
      className={classes}
      title={props.title}
      disabled={props.disabled}
      onClick={event => {
        event.stopPropagation();
        props.onClick();
      }}
    >
      {props.icon && <props.icon.react tag="span" className="jp-RuntimeEnv-buttonIcon" />}
      <span>{props.label}</span>
    </button>
  );
}

/** The output's last lines, kept scrolled to the newest while the user has not scrolled up. */
export function LogBox(props: { lines: string[]; className?: string }): JSX.Element {
  const ref = React.useRef<HTMLPreElement>(null);
  const stick = React.useRef(true);
  React.useLayoutEffect(() => {
    const node = ref.current;
    if (node && stick.current) {
      node.scrollTop = node.scrollHeight;
    }
  }, [props.lines]);
  return (
    <pre
      ref={ref}
      className={`jp-RuntimeEnv-log ${props.className ?? ''}`.trim()}
      onScroll={event => {
        const node = event.currentTarget;
        stick.current = node.scrollTop + node.clientHeight >= node.scrollHeight - 4;
      }}
    >
      {props.lines.join('\n')}
    </pre>
  );
}

function StateBadge(props: { state: string }): JSX.Element {
  return (
    <span className={`jp-RuntimeEnv-state jp-mod-${props.state.toLowerCase()}`}>
      {props.state}
    </span>
  );
}

function Steps(props: { env: IEnv; now: number }): JSX.Element | null {
  const steps = Object.entries(props.env.steps);
  if (!steps.length) {
    return null;
  }
  return (
    <ul className="jp-RuntimeEnv-steps">
      {steps.map(([name, step]) => {
        const status = step.status ?? 'running';
        const seconds =
          step.started && step.ended
            ? step.ended - step.started
            : step.started && status === 'running'
              ? props.now - step.started
              : null;
        return (
          <li key={name} className={`jp-RuntimeEnv-step jp-mod-${status}`} title={name}>
            <span className="jp-RuntimeEnv-stepStatus">{status}</span>
            <span className="jp-RuntimeEnv-stepName">{stepLabel(name, step)}</span>
            {seconds !== null && (
              <span className="jp-RuntimeEnv-meta">{formatDuration(seconds)}</span>
            )}
          </li>
        );
      })}
    </ul>
  );
}

/** ``busy: crunch 12 s`` or ``idle``, CPU, memory, counts, and Stop. */
export function WorkerRow(props: {
  worker: IEnvWorker;
  now: number;
  onStop: () => void;
  where?: string;
}): JSX.Element {
  const { worker, now } = props;
  const stale = React.useContext(StaleContext);
  const task = worker.busy && worker.task ? worker.task : null;
  const failed = worker.tasks_failed ? ` · ${worker.tasks_failed} failed` : '';
  return (
    <div className="jp-RuntimeEnv-worker" data-pid={worker.pid}>
      <div className="jp-RuntimeEnv-workerMain">
        <div className="jp-RuntimeEnv-row">
          <span className="jp-RuntimeEnv-workerWho">pid {worker.pid}</span>
          <span
            className={`jp-RuntimeEnv-workerState ${worker.busy ? 'jp-mod-busy' : 'jp-mod-idle'}`}
            title={stale ? 'at the server’s last report: it does not answer now' : undefined}
          >
            {stale && 'was '}
            {worker.busy ? 'busy' : 'idle'}
          </span>
          {task && (
            <span className="jp-RuntimeEnv-task" title={`running ${task.name}`}>
              {task.name} · {formatDuration(now - task.started)}
            </span>
          )}
        </div>
        <div className="jp-RuntimeEnv-workerOf">
          {worker.cpu !== undefined && worker.cpu !== null && (
            <span title="CPU since the kernel's previous report, or since the worker started (100% = one core)">
              CPU {Math.round(worker.cpu)}% ·{' '}
            </span>
          )}
          {formatBytes(worker.rss)} · {worker.tasks_done} done{failed}
          {props.where && ` · ${props.where}`}
        </div>
      </div>
      <ActionButton
        label="Stop"
        icon={stopIcon}
        title={`Stop worker ${worker.pid} of ${props.where ?? worker.kernel_label}: its task fails with BrokenWorker`}
        onClick={props.onStop}
      />
    </div>
  );
}

function Holders(props: { env: IEnv }): JSX.Element | null {
  const { holders } = props.env;
  if (!holders.length) {
    return <div className="jp-RuntimeEnv-holders">held by nobody: GC removes it</div>;
  }
  return (
    <div className="jp-RuntimeEnv-holders" title={holders.map(h => h.id).join('\n')}>
      <span className="jp-RuntimeEnv-label">held by </span>
      {holders.map(h => h.label).join(', ')}
    </div>
  );
}

/** Why Release cannot do anything here, or null when it can. */
export function releaseBlocked(env: IEnv): string | null {
  if (env.holders.some(h => h.kind === 'user')) {
    return null;
  }
  const others = env.holders.map(h => h.label).join(', ');
  return others
    ? `Release drops the reference taken through the REST API; this one is held by ${others} ` +
        '(released when they stop)'
    : 'Nothing holds it: Delete removes it, GC too';
}

export function EnvCard(props: {
  entry: IEntry;
  now: number;
  expanded: boolean;
  onToggle: () => void;
  actions: ICardActions;
}): JSX.Element {
  const { entry, now, expanded, actions } = props;
  const env = entry.env;
  if (!env) {
    return (
      <div className="jp-RuntimeEnv-card jp-mod-missing" data-env-id={entry.envId}>
        <div className="jp-RuntimeEnv-cardHead">
          <span className={`jp-RuntimeEnv-name ${entry.named ? 'jp-mod-named' : ''}`}>
            {entry.title}
          </span>
          <span className="jp-RuntimeEnv-state jp-mod-missing">NOT BUILT</span>
        </div>
        <div className="jp-RuntimeEnv-brief">
          <span className="jp-RuntimeEnv-id" title={entry.envId}>
            {entry.envId.slice(0, 12)}
          </span>
          <span className="jp-RuntimeEnv-meta">not in the cache: built at its next use</span>
        </div>
      </div>
    );
  }
  const state = env.state;
  const building = state === 'BUILDING' || state === 'PENDING';
  const failed = state === 'FAILED';
  const brief = specBrief(env.spec, env.fields);
  const step = failed ? failedStep(env) : null;
  const tail = failed ? outputTail(env.error?.output_tail) : [];
  const lines = tail.length ? tail : env.log;
  const blocked = releaseBlocked(env);
  const Caret = expanded ? caretDownIcon : caretRightIcon;
  return (
    <div
      className={`jp-RuntimeEnv-card jp-mod-${state.toLowerCase()}`}
      data-env-id={env.env_id}
      data-state={state}
    >
      <div
        className="jp-RuntimeEnv-cardHead"
        role="button"
        tabIndex={0}
        aria-expanded={expanded}
        title={expanded ? 'Collapse' : 'Expand: holders, steps, actions'}
        onClick={props.onToggle}
        onKeyDown={event => {
          if (event.key === 'Enter' || event.key === ' ') {
            event.preventDefault();
            props.onToggle();
          }
        }}
      >
        <Caret.react tag="span" className="jp-RuntimeEnv-caret" />
        <span
          className={`jp-RuntimeEnv-name ${entry.named ? 'jp-mod-named' : ''}`}
          title={entry.title}
        >
          {entry.title}
        </span>
        <StateBadge state={state} />
      </div>
      <div className="jp-RuntimeEnv-brief">
        {entry.named && (
          <span className="jp-RuntimeEnv-briefText" title={brief}>
            {brief}
          </span>
        )}
        <span className="jp-RuntimeEnv-id" title={`env id ${env.env_id}`}>
          {env.env_id.slice(0, 12)}
        </span>
        <span className="jp-RuntimeEnv-spacer" />
        {state === 'READY' && !!env.size && (
          <span className="jp-RuntimeEnv-meta" title="on disk (resources it shares count here too)">
            {formatBytes(env.size)}
          </span>
        )}
        <span
          className="jp-RuntimeEnv-meta jp-RuntimeEnv-age"
          title={`created ${formatAge(env.created, now)} ago; a build, a declare or a task is a use`}
        >
          {formatAge(env.last_used ?? env.created, now)} ago
        </span>
      </div>
      {failed && (
        <div className="jp-RuntimeEnv-error" title={env.error?.message ?? ''}>
          ✗ failed{step ? ` at ${step}` : ''}: {firstLine(env.error?.message) || 'unknown error'}
        </div>
      )}
      {(building || (failed && expanded)) && <Steps env={env} now={now} />}
      {building && env.log.length > 0 && <LogBox lines={env.log} />}
      {failed && expanded && lines.length > 0 && <LogBox lines={lines.slice(-40)} />}
      {entry.workers.length > 0 && (
        <div className="jp-RuntimeEnv-workers">
          <div className="jp-RuntimeEnv-label">workers ({entry.workers.length})</div>
          {entry.workers.map(worker => (
            <WorkerRow
              key={`${worker.kernel_id}:${worker.pid}`}
              worker={worker}
              now={now}
              onStop={() => actions.stopWorker(worker)}
            />
          ))}
        </div>
      )}
      {expanded && <Holders env={env} />}
      {expanded && !building && !failed && <Steps env={env} now={now} />}
      {(expanded || building || failed) && (
        <div className="jp-RuntimeEnv-actions">
          <ActionButton
            label="View log"
            title="Open the whole build log (it follows a build that runs)"
            onClick={() => actions.viewLog(env.env_id)}
          />
          {expanded && (
            <>
              <ActionButton
                label="Rebuild"
                icon={refreshIcon}
                title={
                  failed
                    ? 'Try the build again'
                    : 'Remove and build again (its holders keep it)'
                }
                disabled={building}
                onClick={() => actions.rebuild(env)}
              />
              <ActionButton
                label="Release"
                title={blocked ?? 'Drop the reference taken through the REST API'}
                disabled={blocked !== null}
                onClick={() => actions.release(env)}
              />
              <ActionButton
                label="Delete"
                icon={deleteIcon}
                warn
                title="Remove it from the cache (its holders build it again at their next use)"
                onClick={() => actions.remove(env)}
              />
              <ActionButton
                label="Copy"
                icon={copyIcon}
                title="Copy the spec as YAML, without this machine's interpreter and sys.path"
                onClick={() => actions.copy(env)}
              />
            </>
          )}
        </div>
      )}
    </div>
  );
}
