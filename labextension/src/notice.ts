/**
 * Notifications for actions that may take a while: "in progress" only once the action has run
 * for a moment, and its outcome as a notification of its own.
 *
 * Why not ``Notification.emit`` then ``Notification.update``: JupyterLab creates a toast
 * asynchronously (react-toastify is loaded on the first one), and an update that arrives before
 * the toast is mounted finds it inactive, tries to create it again under the same id, and
 * react-toastify drops that as a duplicate: the first message stays on screen. A rebuild that
 * fails in milliseconds did exactly that in the browser test under load ("Rebuilding…" for good).
 * Dismissing the first and emitting the outcome anew has no such window.
 */
import type { Notification } from '@jupyterlab/apputils';

/** How long an action runs before it is said to be in progress. */
export const PROGRESS_DELAY_MS = 400;

export interface ITimers {
  setTimer(fn: () => void, ms: number): unknown;
  clearTimer(handle: unknown): void;
}

const TIMERS: ITimers = {
  setTimer: (fn, ms) => setTimeout(fn, ms),
  clearTimer: handle => clearTimeout(handle as ReturnType<typeof setTimeout>)
};

/** Where the notifications go: JupyterLab's ``Notification`` (a test gives its own). */
export interface INotifier {
  emit(message: string, type: Notification.TypeOptions, options?: Notification.IOptions<never>): string;
  dismiss(id: string): void;
}

export class Progress {
  constructor(
    message: string,
    private notifier: INotifier,
    private timers: ITimers = TIMERS
  ) {
    this._timer = timers.setTimer(() => {
      this._timer = null;
      this._id = this.notifier.emit(message, 'in-progress', { autoClose: false });
    }, PROGRESS_DELAY_MS);
  }

  /** The action ended: take "in progress" away (or never show it) and say how it ended. */
  end(message: string, type: Notification.TypeOptions, options: Notification.IOptions<never> = {}): void {
    if (this._timer !== null) {
      this.timers.clearTimer(this._timer);
      this._timer = null;
    }
    if (this._id !== null) {
      this.notifier.dismiss(this._id);
      this._id = null;
    }
    this.notifier.emit(message, type, options);
  }

  private _timer: unknown = null;
  private _id: string | null = null;
}
