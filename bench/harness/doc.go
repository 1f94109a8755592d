// Package harness runs extworker's benchmark against the official Camunda 7 clients
// (bench/, make bench): the same engine, the same PostgreSQL, the same process model
// and the same machine, each client's worker a separate OS process, the clients taking
// turns within every run so that the machine's drift spreads over all of them.
//
// The scenarios (numbered as in issue #7):
//
//  1. no-op handler: tasks per second end to end, worker CPU seconds, peak RSS;
//  2. I/O-bound handler (Options.IOWait per task): wall time, each client with its
//     defaults and with its best configuration;
//  3. pickup latency, long polling on for every client: from the start-process call
//     returning to the handler starting, p50 and p99;
//  4. extworker with and without the effect ledger on the no-op handler, taking turns:
//     tasks per second, CPU per task, and the throughput the ledger costs, paired by run;
//  5. the worker's own ceiling against a stub engine in another process, beside a raw
//     HTTP loop doing one fetch and one complete per task;
//  6. the engine's ceiling: extworker and that raw loop (at Options.RawConcurrency
//     loops) taking turns on the real engine at saturation; the fastest raw loop is the
//     yardstick for extworker's tasks per second and for the engine's and PostgreSQL's
//     CPU per task under it;
//  7. many tasks in flight (issue #16), once per Run, extworker only: Options.N7 tasks
//     held at once for Options.Hold7 with Options.Lock7 locks kept alive by the worker's
//     one lock scheduler; RSS with every task in flight, locks lost, extension lateness
//     and the engine's extendLock rate.
//
// Worker programs print "FIRST <unix ns>" when their first handler starts and, for
// scenario 3, "PICKUP <business key> <unix ns>" when any handler starts; the driver
// reads their stdout, counts the open external tasks of the run's topic on the engine,
// and takes CPU time and peak RSS from the child's rusage after it exits.
//
// Run writes RESULTS.md (medians and ranges, versions, goals, profiles) and
// scenarios.svg into Options.OutDir.
package harness
