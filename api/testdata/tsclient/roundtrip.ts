// A client of the task API generated from api/openapi.json: the test
// generates ./schema.ts with openapi-typescript beside this file, then type
// checks it (tsc --noEmit, so a script that no longer fits the document
// fails) and runs it with tsx.
//
// It creates a task, awaits it with GET /v1/tasks/{id}?wait=30s until its
// status is terminal (a server that does not wait answers at once: the loop
// then pauses a little before asking again), and prints the final task.
//
// Environment: INGEST_API_URL (the server, or a proxy in front of it),
// INGEST_API_TOKEN, TASK_KIND, TASK_PAYLOAD (JSON).
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

  const deadline = Date.now() + 60_000;
  let task: TaskDetail;
  for (;;) {
    const asked = Date.now();
    const got = await client.GET("/v1/tasks/{id}", {
      params: { path: { id }, query: { wait: "30s" } },
    });
    if (got.error !== undefined) {
      throw new Error(describe(`get ${id}`, got.response.status, got.error));
    }
    task = got.data;
    if (terminal.has(task.status)) {
      break;
    }
    if (Date.now() > deadline) {
      throw new Error(`task ${id} is still ${task.status} after 60 s`);
    }
    if (Date.now() - asked < 1_000) {
      // The server answered at once (it does not wait): poll gently.
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
  const { transitions, ...rest } = task;
  console.log(JSON.stringify({ ...rest, result: rest.result ?? null, transitions: transitions.length }));
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.message : err);
  process.exit(1);
});
