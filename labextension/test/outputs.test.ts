import { describe, expect, it } from 'vitest';

import {
  IOutputsLike,
  IStaticOutput,
  METADATA_KEY,
  WIDGET_MIME,
  finalsExpression,
  liveBuild,
  orphanedBuild,
  replaceOutputs,
  replacedModels,
  widgetModels
} from '../src/outputs';

const finalUpdate = (ids: unknown) => ({
  header: { msg_type: 'update_display_data' },
  content: {
    data: { 'text/html': '<b>READY</b>', 'text/plain': 'READY' },
    metadata: { [METADATA_KEY]: { replaces: ids } },
    transient: { display_id: 'd1' }
  }
});

class Outputs implements IOutputsLike {
  constructor(public items: Array<{ data: Record<string, unknown> }>) {}
  get length(): number {
    return this.items.length;
  }
  get(index: number) {
    return this.items[index];
  }
  set(index: number, output: IStaticOutput): void {
    this.items[index] = output;
  }
}

describe('final widget updates', () => {
  it('names the models a final update replaces, and nothing for other messages', () => {
    expect(replacedModels(finalUpdate(['m1', 'm2']))).toEqual(['m1', 'm2']);
    expect(replacedModels(finalUpdate('m1'))).toEqual([]);
    expect(replacedModels(finalUpdate([3, 'm1']))).toEqual(['m1']);
    const other = { ...finalUpdate(['m1']), header: { msg_type: 'display_data' } };
    expect(replacedModels(other)).toEqual([]);
    expect(
      replacedModels({
        header: { msg_type: 'update_display_data' },
        content: { data: {}, metadata: {} }
      })
    ).toEqual([]);
  });

  it('swaps only the outputs that show a replaced model', () => {
    const outputs = new Outputs([
      { data: { 'text/plain': 'hello' } },
      { data: { [WIDGET_MIME]: { model_id: 'm1' }, 'text/plain': 'PENDING' } },
      { data: { [WIDGET_MIME]: { model_id: 'other' } } }
    ]);
    const output: IStaticOutput = {
      output_type: 'display_data',
      data: { 'text/html': '<b>READY</b>', 'text/plain': 'READY' },
      metadata: {}
    };
    expect(replaceOutputs(outputs, ['m1'], output)).toBe(1);
    expect(outputs.items[1]).toBe(output);
    expect(outputs.items[0].data['text/plain']).toBe('hello');
    expect(outputs.items[2].data[WIDGET_MIME]).toEqual({ model_id: 'other' });
    // Applied twice (JupyterLab applied it already): nothing left to swap.
    expect(replaceOutputs(outputs, ['m1'], output)).toBe(0);
  });
});

describe('finals asked of the kernel', () => {
  it('lists the widget models shown and asks for them without importing anything', () => {
    const outputs = new Outputs([
      { data: { 'text/plain': 'x' } },
      { data: { [WIDGET_MIME]: { model_id: 'ab12' } } },
      { data: { [WIDGET_MIME]: { model_id: 'cd34' } } }
    ]);
    expect(widgetModels(outputs)).toEqual(['ab12', 'cd34']);
    const expr = finalsExpression(['ab12', 'cd34']);
    expect(expr).toContain("modules.get('jupyter_runtimeenv.ipython.static')");
    expect(expr).toContain('(["ab12","cd34"])');
    expect(expr).not.toContain('import ');
  });
});

describe('build widgets a restarted kernel left live', () => {
  const widget = { [WIDGET_MIME]: { model_id: 'm1' } };
  it('knows a live build widget by its metadata, and nothing else', () => {
    const build = { [METADATA_KEY]: { build: 'ab'.repeat(32) } };
    expect(liveBuild({ data: widget, metadata: build })).toBe('ab'.repeat(32));
    expect(liveBuild({ data: widget, metadata: {} })).toBeNull();
    expect(liveBuild({ data: widget })).toBeNull();
    // Its static form (the same metadata key, no widget) is not live.
    expect(liveBuild({ data: { 'text/plain': 'x' }, metadata: build })).toBeNull();
  });
  it('says what stays true: a final state, or that the build goes on', () => {
    const id = 'cd'.repeat(32);
    const ready = orphanedBuild(id, 'READY');
    expect(ready.data['text/plain']).toBe(
      'runtime env cdcdcdcdcdcd — READY in the server (the kernel restarted before this cell' +
        ' saw it end: run the cell again)'
    );
    expect(liveBuild(ready)).toBeNull();
    expect(orphanedBuild(id, 'BUILDING').data['text/plain']).toContain(
      'the kernel restarted while it was building (the build goes on in the server'
    );
    expect(orphanedBuild(id, null).data['text/plain']).toContain(
      'the kernel restarted before its build ended'
    );
    expect(String(orphanedBuild('<b>', 'FAILED').data['text/html'])).toContain('&#60;b&#62;');
  });
  it('says so when the notebook opened on a kernel that never had the widget', () => {
    const id = 'cd'.repeat(32);
    expect(orphanedBuild(id, null, 'gone').data['text/plain']).toBe(
      'runtime env cdcdcdcdcdcd — the kernel that showed it stopped before its build ended' +
        ' (run the cell again)'
    );
    expect(orphanedBuild(id, 'READY', 'gone').data['text/plain']).toContain(
      'READY in the server (the kernel that showed it stopped before this cell saw it end'
    );
  });
});
