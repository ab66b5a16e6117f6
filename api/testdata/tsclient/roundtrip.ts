// A client of the task API generated from api/openapi.json: the test
// generates ./schema.ts with openapi-typescript beside this file, then type
// checks it (tsc --noEmit, so a script that no longer fits the document
// fails) and runs it with tsx.
//
// It creates a task, awaits it with GET /v1/tasks/{id}?wait=30s (asking
// again while the task is not terminal after a whole wait), checks that the
// task SUCCEEDED with the expected result, and prints the final task. It
// exits 1 with a message naming what differs otherwise.
//
// Environment: INGEST_API_URL (the server, or a proxy in front of it),
// INGEST_API_TOKEN, TASK_KIND, TASK_PAYLOAD (JSON), TASK_RESULT (JSON: the
// result the handler, such as a webhook receiver, returns).
import { isDeepStrictEqual } from "node:util";
import createClient from "openapi-fetch";
import type { components, paths } from "./schema";

type TaskDetail = components["schemas"]["TaskDetail"];
type ApiError = components["schemas"]["Error"];
type TaskStatus = components["schemas"]["TaskStatus"];

const terminal: ReadonlySet<TaskStatus> = new Set<TaskStatus>(["SUCCEEDED", "DEAD", "CANCELLED"]);

function env(name: string): string {
  const v = process.env[name];
  if (v === undefined || v === "") {
    throw new Error(`${name} is not set`);
  }
  return v;
}

// describe writes an error answer: JSON naming the field at fault, or the
// plain text of a refused Host (421).
function describe(what: string, status: number, err: ApiError | string): string {
  if (typeof err === "string") {
    return `${what}: ${status} ${err}`;
  }
  return `${what}: ${status} ${err.field ?? ""}: ${err.error}`;
}

async function main(): Promise<void> {
  const client = createClient<paths>({
    baseUrl: env("INGEST_API_URL"),
    headers: { Authorization: `Bearer ${env("INGEST_API_TOKEN")}` },
  });

  const created = await client.POST("/v1/tasks", {
    body: { kind: env("TASK_KIND"), payload: JSON.parse(env("TASK_PAYLOAD")) as unknown },
  });
  if (created.error !== undefined) {
    throw new Error(describe("create", created.response.status, created.error));
  }
  const id: string = created.data.id;

  const expected: unknown = JSON.parse(env("TASK_RESULT"));

  const waitMs = 30_000;
  const deadline = performance.now() + 2 * waitMs;
  let task: TaskDetail;
  for (;;) {
    const asked = performance.now();
    const got = await client.GET("/v1/tasks/{id}", {
      params: { path: { id }, query: { wait: `${waitMs / 1000}s` } },
    });
    if (got.error !== undefined) {
      throw new Error(describe(`get ${id}`, got.response.status, got.error));
    }
    task = got.data;
    if (terminal.has(task.status)) {
      break;
    }
    // The server holds the answer until the task is terminal or the
    // whole wait has passed.
    const held = performance.now() - asked;
    if (held < waitMs) {
      throw new Error(`get ${id}?wait=30s answered the ${task.status} task after ${Math.round(held)} ms: the server did not wait`);
    }
    if (performance.now() > deadline) {
      throw new Error(`task ${id} is still ${task.status} after ${(2 * waitMs) / 1000} s`);
    }
  }
  if (task.status !== "SUCCEEDED") {
    throw new Error(`task ${id} ended ${task.status} (last error: ${task.last_error ?? "none"}), want SUCCEEDED`);
  }
  if (!isDeepStrictEqual(task.result, expected)) {
    throw new Error(`task ${id} has result ${JSON.stringify(task.result)}, want ${JSON.stringify(expected)}`);
  }
  const { transitions, ...rest } = task;
  console.log(JSON.stringify({ ...rest, transitions: transitions.length }));
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
