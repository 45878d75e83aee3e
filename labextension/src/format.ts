/**
 * How the sidebar writes things (pure functions, no DOM): specs in brief with their version
 * pins, sizes, ages and durations, step labels, a portable spec as YAML.
 */
import type { IEnv, IStep } from './model';

/** Filled in by each driver for its own machine: never part of a portable spec. */
export const DRIVER_KEYS = ['driver_python', 'driver_sys_path'];
/** Requirements shown in a brief before "+N more". */
const BRIEF_REQUIREMENTS = 4;
const NOTHING = 'no packages (the driver’s Python)';

/** ``pip: numpy==1.26, pandas · working_dir: data/ · env_vars: 2``; the field names alone
 * when the overview did not carry the spec. Version pins stay: they are what differs. */
export function specBrief(
  spec: Record<string, unknown> | null,
  fields: string[] = []
): string {
  if (!spec) {
    const names = fields.filter(f => !DRIVER_KEYS.includes(f));
    return names.length ? names.join(' · ') : NOTHING;
  }
  const parts: string[] = [];
  for (const [key, value] of Object.entries(spec)) {
    if (key === 'config' || DRIVER_KEYS.includes(key)) {
      continue;
    }
    parts.push(`${key}: ${briefValue(key, value)}`);
  }
  return parts.length ? parts.join(' · ') : NOTHING;
}

function briefValue(key: string, value: unknown): string {
  if (key === 'pip' || key === 'uv') {
    const packages = Array.isArray(value)
      ? value
      : ((value as { packages?: unknown })?.packages ?? value);
    if (Array.isArray(packages)) {
      const shown = packages.slice(0, BRIEF_REQUIREMENTS).map(p => requirement(String(p)));
      const more = packages.length - shown.length;
      return shown.join(', ') + (more > 0 ? ` +${more} more` : '');
    }
    return basename(String(packages));
  }
  if (key === 'plugins' && value && typeof value === 'object') {
    return Object.keys(value)
      .map(path => path.split('.').pop())
      .join(', ');
  }
  if (key === 'env_vars' && value && typeof value === 'object') {
    return String(Object.keys(value).length);
  }
  if (key === 'working_dir') {
    return basename(String(value)) + '/';
  }
  if (key === 'py_modules' && Array.isArray(value)) {
    return value.map(v => basename(String(v))).join(', ');
  }
  if (typeof value === 'string') {
    return basename(value);
  }
  if (Array.isArray(value)) {
    return String(value.length);
  }
  if (value && typeof value === 'object') {
    return Object.keys(value).join(', ');
  }
  return String(value);
}

/** A requirement as users wrote it, pins included (``numpy==1.26``); a path or URL by its
 * last part (``pkg @ file:///…/pkg`` → ``pkg``). */
export function requirement(text: string): string {
  const trimmed = text.trim().replace(/\s+/g, ' ');
  const at = / @ /.exec(trimmed);
  if (at) {
    return trimmed.slice(0, at.index);
  }
  if (trimmed.includes('/')) {
    return basename(trimmed);
  }
  return trimmed;
}

/** ``numpy==1.26`` -> ``numpy``; a path -> its last part. */
export function requirementName(text: string): string {
  if (text.includes('/') && !text.includes(' @ ')) {
    return basename(text);
  }
  const match = /^[A-Za-z0-9._-]+(\[[^\]]*\])?/.exec(text.trim());
  return match ? match[0] : text;
}

function basename(path: string): string {
  const parts = path.replace(/\/+$/, '').split('/');
  return parts[parts.length - 1] || path;
}

export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) {
    return '–';
  }
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return unit === 0
    ? `${value} B`
    : `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

/** ``12 s``, ``5 min``, ``3 h``, ``2 d``: a length of time in seconds. */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, seconds);
  if (s < 60) {
    return `${Math.round(s)} s`;
  }
  if (s < 3600) {
    return `${Math.round(s / 60)} min`;
  }
  if (s < 86400) {
    return `${Math.round(s / 3600)} h`;
  }
  return `${Math.round(s / 86400)} d`;
}

/** How long ago ``epochSeconds`` was (``–`` when unknown). */
export function formatAge(
  epochSeconds: number | null | undefined,
  now: number = Date.now() / 1000
): string {
  return epochSeconds ? formatDuration(now - epochSeconds) : '–';
}

/** A step as users read it: the plugin's label (``pip: numpy==1.26``), else its key. */
export function stepLabel(name: string, step: IStep | undefined): string {
  const label = step?.label;
  return typeof label === 'string' && label ? label : name;
}

/** The step that failed, as users read it: the failed step's label, else the error's. */
export function failedStep(env: IEnv): string | null {
  for (const [name, step] of Object.entries(env.steps)) {
    if (step.status === 'failed') {
      return stepLabel(name, step);
    }
  }
  const label = env.error?.label;
  if (typeof label === 'string' && label) {
    return label;
  }
  const key = env.error?.step ? String(env.error.step) : null;
  return key ? stepLabel(key, env.steps[key]) : null;
}

/** The first line of a message (a FAILED card collapsed to one line says this). */
export function firstLine(text: string | undefined | null): string {
  const line = (text ?? '').split('\n').find(l => l.trim()) ?? '';
  return line.trim();
}

/** The installer output's tail of a build error: a list of lines or a text. */
export function outputTail(tail: unknown): string[] {
  if (Array.isArray(tail)) {
    return tail.map(String);
  }
  return tail ? String(tail).split('\n') : [];
}

/** A spec someone else can use: without what a driver fills in for its own machine. */
export function portableSpec(spec: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(spec).filter(([key]) => !DRIVER_KEYS.includes(key))
  );
}

/** A spec as YAML (flat, good enough for ``copy spec``; JSON values where nested). */
export function specToYaml(spec: Record<string, unknown>): string {
  const lines: string[] = [];
  const emit = (value: unknown, indent: string): void => {
    if (Array.isArray(value)) {
      for (const item of value) {
        if (item && typeof item === 'object') {
          lines.push(`${indent}- ${JSON.stringify(item)}`);
        } else {
          lines.push(`${indent}- ${scalar(item)}`);
        }
      }
      return;
    }
    for (const [key, item] of Object.entries(value as Record<string, unknown>)) {
      if (item && typeof item === 'object') {
        if (Array.isArray(item) && item.length === 0) {
          lines.push(`${indent}${key}: []`);
        } else if (!Array.isArray(item) && Object.keys(item).length === 0) {
          lines.push(`${indent}${key}: {}`);
        } else {
          lines.push(`${indent}${key}:`);
          emit(item, indent + '  ');
        }
      } else {
        lines.push(`${indent}${key}: ${scalar(item)}`);
      }
    }
  };
  emit(spec, '');
  return lines.join('\n') + '\n';
}

function scalar(value: unknown): string {
  if (typeof value === 'string') {
    return /^[A-Za-z0-9_./][A-Za-z0-9_./=<>~!,* -]*$/.test(value) &&
      !/^(true|false|null|yes|no|on|off|[0-9.]+)$/i.test(value)
      ? value
      : JSON.stringify(value);
  }
  return JSON.stringify(value);
}

/** The envs GC leaves, said whole: ``1 held environment``, ``2 held and 1 building
 * environments``; '' for none. */
export function gcKept(held: number, building = 0): string {
  const parts = [held ? `${held} held` : '', building ? `${building} building` : ''];
  const total = held + building;
  return total ? `${parts.filter(Boolean).join(' and ')} environment${total === 1 ? '' : 's'}` : '';
}

/** ``stays`` or ``stay`` after ``gcKept``. */
export function gcStay(held: number, building = 0): string {
  return held + building === 1 ? 'stays' : 'stay';
}
