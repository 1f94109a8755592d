// Minimal worker on the official Camunda 7 JS client (camunda-external-task-client-js),
// run by extworker's benchmark (bench/, make bench). It does what bench/cmd/goworker
// does for the scenario: complete each task at once (-mode noop) or after waiting
// (-mode io), and print to stdout
//
//   FIRST <unix ns>                  when the first handler starts
//   PICKUP <business key> <unix ns>  when a handler starts (with -latency)
//   REQUESTS <fetches> <completes>   at exit: fetchAndLock calls that succeeded, completes
//
// Options left out keep the client's defaults; the driver passes the configuration.
import { Client } from "camunda-external-task-client-js";

function parseArgs(argv) {
  const o = { engine: "http://127.0.0.1:8080/engine-rest", topic: "", mode: "noop", ioMs: 50, latency: false };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i].replace(/^-+/, "");
    const next = () => argv[++i];
    switch (k) {
      case "engine": o.engine = next(); break;
      case "topic": o.topic = next(); break;
      case "mode": o.mode = next(); break;
      case "io-ms": o.ioMs = Number(next()); break;
      case "latency": o.latency = true; break;
      case "max-tasks": o.maxTasks = Number(next()); break;
      case "max-parallel": o.maxParallelExecutions = Number(next()); break;
      case "interval": o.interval = Number(next()); break;
      case "long-poll-ms": o.asyncResponseTimeout = Number(next()); break;
      case "lock-ms": o.lockDuration = Number(next()); break;
      default: throw new Error(`unknown argument ${argv[i]}`);
    }
  }
  if (!o.topic) throw new Error("-topic is required");
  return o;
}

const o = parseArgs(process.argv.slice(2));
const nowNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
const opts = { baseUrl: o.engine, workerId: `js-bench-${process.pid}` };
for (const k of ["maxTasks", "maxParallelExecutions", "interval", "asyncResponseTimeout", "lockDuration"]) {
  if (o[k] !== undefined) opts[k] = o[k];
}
const client = new Client(opts);
let fetches = 0;
let completes = 0;
client.on("poll:success", () => fetches++);
client.on("complete:success", () => completes++);
client.on("poll:error", (e) => console.error(`poll error: ${e}`));
client.on("complete:error", (_task, e) => console.error(`complete error: ${e}`));

let first = true;
client.subscribe(o.topic, async ({ task, taskService }) => {
  const t = nowNs();
  if (first) {
    first = false;
    process.stdout.write(`FIRST ${t}\n`);
  }
  if (o.latency) process.stdout.write(`PICKUP ${task.businessKey} ${t}\n`);
  if (o.mode === "io") await new Promise((r) => setTimeout(r, o.ioMs));
  await taskService.complete(task);
});

const stop = () => {
  client.stop();
  process.stdout.write(`REQUESTS ${fetches} ${completes}\n`);
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
