/**
 * The transport of the model: the extension's REST API through
 * ``ServerConnection.makeRequest`` (it carries the token and the XSRF cookie), and the
 * server's event stream over ``/api/events/subscribe``.
 *
 * Why a socket of our own rather than ``serviceManager.events.stream``: the core
 * ``EventManager`` reconnects quietly and does not say when its socket is down, and the model
 * must know that to poll only then. One more socket per page, with a state we can see.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IEmission, ITransport } from './model';

export const API_PATH = 'jupyter-runtimeenv/api';

export class RequestError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly kind: string
  ) {
    super(message);
  }
}

export class ServerTransport implements ITransport {
  constructor(readonly settings: ServerConnection.ISettings) {}

  async request<T = any>(
    method: string,
    path: string,
    body?: unknown
  ): Promise<T> {
    const url = URLExt.join(this.settings.baseUrl, API_PATH, path);
    const init: RequestInit = { method };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { 'Content-Type': 'application/json' };
    }
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.settings);
    } catch (error) {
      throw new ServerConnection.NetworkError(error as TypeError);
    }
    const text = await response.text();
    const type = response.headers.get('Content-Type') ?? '';
    const data = text && type.includes('json') ? JSON.parse(text) : text;
    if (!response.ok) {
      const info = (data && typeof data === 'object' ? data : {}) as {
        message?: string;
        type?: string;
      };
      throw new RequestError(
        info.message || response.statusText || `HTTP ${response.status}`,
        response.status,
        info.type || ''
      );
    }
    return data as T;
  }

  subscribe(
    onEvent: (event: IEmission) => void,
    onState: (connected: boolean) => void
  ): { dispose(): void } {
    let socket: WebSocket | null = null;
    let disposed = false;
    let retry: ReturnType<typeof setTimeout> | null = null;
    let delay = 1000;
    const open = () => {
      let url = URLExt.join(this.settings.wsUrl, 'api', 'events', 'subscribe');
      if (this.settings.token && this.settings.appendToken) {
        url += `?token=${encodeURIComponent(this.settings.token)}`;
      }
      socket = new this.settings.WebSocket(url);
      socket.onopen = () => {
        delay = 1000;
        onState(true);
      };
      socket.onmessage = (msg: MessageEvent) => {
        try {
          onEvent(JSON.parse(String(msg.data)) as IEmission);
        } catch {
          // not an event: ignore
        }
      };
      socket.onclose = () => {
        socket = null;
        onState(false);
        if (!disposed) {
          retry = setTimeout(open, delay);
          delay = Math.min(delay * 2, 30000);
        }
      };
    };
    open();
    return {
      dispose: () => {
        disposed = true;
        if (retry !== null) {
          clearTimeout(retry);
        }
        socket?.close();
      }
    };
  }
}
