/** One shard: its items are [start, end). */
export interface Shard {
  task_id: string;
  taskId: string;
  kind: string;
  index: number;
  total: number;
  start: number;
  end: number;
  key: string;
  attempt: number;
  payload: unknown;
  signal: AbortSignal;
  cancelled(): boolean;
}

export interface Outcome {
  shard: number;
  result: unknown;
  error: string | null;
}

export interface Aggregation {
  task_id: string;
  taskId: string;
  kind: string;
  total: number;
  done: number;
  failed: number;
  /** Shards cancelled once the task met its --success-when (they have no outcome). */
  cancelled: number;
  attempt: number;
  payload: unknown;
  signal: AbortSignal;
  outcomes: AsyncIterable<Outcome>;
  cancelled(): boolean;
}

export const PROTOCOL: 1;

/** The shard fails for good now, whatever attempts are left (malformed input). */
export class Permanent extends Error {}

/** Not now: the next attempt not before `seconds` from now; it uses no attempt. */
export class RetryAfter extends Error {
  constructor(seconds: number, message?: string);
  readonly seconds: number;
}

/** A fatal error of the whole task: the task fails at once, its other shards stopped. */
export class FailTask extends Error {}

export function serve(
  handler: (shard: Shard) => unknown | Promise<unknown>,
  aggregator?: (agg: Aggregation) => unknown | Promise<unknown>,
  io?: { input?: NodeJS.ReadableStream; output?: NodeJS.WritableStream; maxRequests?: number },
): Promise<void>;
