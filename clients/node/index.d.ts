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
  attempt: number;
  payload: unknown;
  signal: AbortSignal;
  outcomes: AsyncIterable<Outcome>;
  cancelled(): boolean;
}

export const PROTOCOL: 1;

export function serve(
  handler: (shard: Shard) => unknown | Promise<unknown>,
  aggregator?: (agg: Aggregation) => unknown | Promise<unknown>,
  io?: { input?: NodeJS.ReadableStream; output?: NodeJS.WritableStream; maxRequests?: number },
): Promise<void>;
