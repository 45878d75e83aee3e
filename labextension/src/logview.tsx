/**
 * An environment's whole build log in a main-area tab (the ``runtimeenv:view-log`` command:
 * the sidebar's cards, its notifications, and links in the build widget of a notebook). While
 * the env builds, the log follows: it is read again as the model hears of new output, at most
 * once a second, and stays scrolled to its end unless the reader scrolled up.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { ReactWidget, refreshIcon, textEditorIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

import { ActionButton, LogBox } from './card';
import type { RuntimeEnvModel } from './model';

/** How often a building env's log is read again, at most. */
const FOLLOW_MS = 1000;

function LogView(props: { model: RuntimeEnvModel; envId: string }): JSX.Element {
  const { model, envId } = props;
  const [text, setText] = React.useState<string | null>(null);
  const [error, setError] = React.useState<string | null>(null);
  const [state, setState] = React.useState(model.envs.get(envId)?.state ?? '');
  const load = React.useCallback(async () => {
    try {
      setText(await model.fullLog(envId));
      setError(null);
    } catch (reason) {
      setError(reason instanceof Error ? reason.message : String(reason));
    }
  }, [model, envId]);
  React.useEffect(() => {
    void load();
    let last = Date.now();
    let pending: ReturnType<typeof setTimeout> | null = null;
    const disconnect = model.changed.connect(() => {
      const env = model.envs.get(envId);
      setState(env?.state ?? '');
      if (!env || pending !== null) {
        return;
      }
      const wait = Math.max(0, last + FOLLOW_MS - Date.now());
      pending = setTimeout(() => {
        pending = null;
        last = Date.now();
        void load();
      }, wait);
    });
    return () => {
      disconnect();
      if (pending !== null) {
        clearTimeout(pending);
      }
    };
  }, [model, envId, load]);
  const lines = React.useMemo(() => (text ?? '').split('\n'), [text]);
  return (
    <div className="jp-RuntimeEnv-logView" data-env-id={envId}>
      <div className="jp-RuntimeEnv-row jp-RuntimeEnv-logViewHead">
        <span className="jp-RuntimeEnv-id">{envId.slice(0, 12)}</span>
        {state && (
          <span className={`jp-RuntimeEnv-state jp-mod-${state.toLowerCase()}`}>{state}</span>
        )}
        {(state === 'BUILDING' || state === 'PENDING') && (
          <span className="jp-RuntimeEnv-meta">following the build</span>
        )}
        <span className="jp-RuntimeEnv-spacer" />
        <ActionButton label="Reload" icon={refreshIcon} title="Read the log again" onClick={() => void load()} />
      </div>
      {error && <div className="jp-RuntimeEnv-notice jp-mod-error">{error}</div>}
      {text === null && !error ? (
        <div className="jp-RuntimeEnv-empty">Loading…</div>
      ) : (
        <LogBox lines={lines} className="jp-RuntimeEnv-logFull" />
      )}
    </div>
  );
}

class LogContent extends ReactWidget {
  constructor(
    readonly model: RuntimeEnvModel,
    readonly envId: string
  ) {
    super();
    this.addClass('jp-RuntimeEnv-logContent');
  }

  render(): JSX.Element {
    return <LogView model={this.model} envId={this.envId} />;
  }
}

/** A tab showing ``envId``'s build log. */
export function createLogWidget(model: RuntimeEnvModel, envId: string): MainAreaWidget {
  const widget = new MainAreaWidget({ content: new LogContent(model, envId) });
  widget.id = `jupyter-runtimeenv-log-${envId}`;
  widget.title.label = `Build log ${envId.slice(0, 12)}`;
  widget.title.icon = textEditorIcon;
  widget.title.closable = true;
  return widget;
}
