import { describe, expect, it } from 'vitest';

import { INotifier, ITimers, PROGRESS_DELAY_MS, Progress } from '../src/notice';

class Recorder implements INotifier {
  said: string[] = [];
  private _n = 0;
  emit(message: string, type: string): string {
    const id = `n${++this._n}`;
    this.said.push(`emit ${id} ${type}: ${message}`);
    return id;
  }
  dismiss(id: string): void {
    this.said.push(`dismiss ${id}`);
  }
}

class Clock implements ITimers {
  pending = new Map<number, [() => void, number]>();
  private _n = 0;
  setTimer = (fn: () => void, ms: number): unknown => {
    this.pending.set(++this._n, [fn, ms]);
    return this._n;
  };
  clearTimer = (handle: unknown): void => {
    this.pending.delete(handle as number);
  };
  fire(): void {
    for (const [id, [fn]] of Array.from(this.pending)) {
      this.pending.delete(id);
      fn();
    }
  }
}

describe('Progress', () => {
  it('says only the outcome of an action that ends at once', () => {
    const notes = new Recorder();
    const clock = new Clock();
    const progress = new Progress('Rebuilding x…', notes, clock);
    expect([...clock.pending.values()].map(p => p[1])).toEqual([PROGRESS_DELAY_MS]);
    progress.end('Rebuild of x failed at script', 'error');
    clock.fire();
    expect(notes.said).toEqual(['emit n1 error: Rebuild of x failed at script']);
  });

  it('shows a slow action in progress, then replaces it by its outcome (never updates it)', () => {
    const notes = new Recorder();
    const clock = new Clock();
    const progress = new Progress('Rebuilding x…', notes, clock);
    clock.fire();
    progress.end('x rebuilt: READY', 'success');
    expect(notes.said).toEqual([
      'emit n1 in-progress: Rebuilding x…',
      'dismiss n1',
      'emit n2 success: x rebuilt: READY'
    ]);
  });
});
