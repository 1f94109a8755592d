// Minimal worker on the official Camunda 7 JS client (camunda-external-task-client-js),
// run by extworker's benchmark (bench/, make bench). It does what bench/cmd/goworker
// does for the scenario: complete each task at once (-mode noop) or after waiting
// (-mode io), and print to stdout
//
//   FIRST <unix ns>                  when the first handler starts
//   PICKUP <business key> <unix ns>  when a handler starts (with -latency)
//   REQUESTS <fetches> <completes> <complete ms>
//                                    at exit: fetchAndLock calls that succeeded, completes,
//                                    and the completes' summed latency
//   SLOTS <window ms> <free slot-ms> <polls> <tasks polled> <poll ms> <max parallel>
//                                    at exit, with maxParallelExecutions: as goworker's, where
//                                    the handler slots' time went (a slot is taken from the
//                                    handler's start to its end, the awaited complete included)
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
let completeMs = 0;
// Slot accounting (see SLOTS above): free slots integrated over time from the first
// handler start to the last handler end, and the polls' count, tasks and latency.
const slots = { active: 0, first: 0, last: 0, freeMs: 0, polls: 0, polled: 0, pollMs: 0, pollStart: 0 };
const slotChange = (d) => {
  const now = performance.now();
  if (slots.first === 0) slots.first = now;
  else if (o.maxParallelExecutions) slots.freeMs += (o.maxParallelExecutions - slots.active) * (now - slots.last);
  slots.active += d;
  slots.last = now;
};
client.on("poll:start", () => { slots.pollStart = performance.now(); });
client.on("poll:success", (tasks) => {
  slots.polls++;
  slots.polled += tasks.length;
  slots.pollMs += performance.now() - slots.pollStart;
});
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
  slotChange(1);
  try {
    if (o.mode === "io") await new Promise((r) => setTimeout(r, o.ioMs));
    const c = performance.now();
    await taskService.complete(task);
    completeMs += performance.now() - c;
  } finally {
    slotChange(-1);
  }
});

const stop = () => {
  client.stop();
  process.stdout.write(`REQUESTS ${fetches} ${completes} ${Math.round(completeMs)}\n`);
  if (o.maxParallelExecutions) {
    const r = Math.round;
    process.stdout.write(`SLOTS ${r(slots.last - slots.first)} ${r(slots.freeMs)} ${slots.polls} ${slots.polled} ${r(slots.pollMs)} ${o.maxParallelExecutions}\n`);
  }
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
