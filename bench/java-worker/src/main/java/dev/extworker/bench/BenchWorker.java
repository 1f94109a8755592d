package dev.extworker.bench;

import java.io.PrintStream;
import java.time.Instant;
import java.util.concurrent.atomic.AtomicBoolean;

import org.camunda.bpm.client.ExternalTaskClient;
import org.camunda.bpm.client.ExternalTaskClientBuilder;
import org.camunda.bpm.client.topic.TopicSubscriptionBuilder;

/**
 * Minimal worker on the official Camunda 7 Java client, run by extworker's benchmark
 * (bench/, make bench). It does what bench/cmd/goworker does for the scenario: complete
 * each task at once (-mode noop) or after waiting (-mode io), and print to stdout
 *
 * <pre>
 *   FIRST &lt;unix ns&gt;                  when the first handler starts
 *   PICKUP &lt;business key&gt; &lt;unix ns&gt;  when a handler starts (with -latency)
 * </pre>
 *
 * Options left out keep the client's defaults; the driver passes the configuration.
 */
public final class BenchWorker {
  private BenchWorker() {}

  public static void main(String[] args) {
    String engine = "http://127.0.0.1:8080/engine-rest";
    String topic = null;
    String mode = "noop";
    long ioMs = 50;
    boolean latency = false;
    Integer maxTasks = null;
    Long longPollMs = null;
    Long lockMs = null;
    for (int i = 0; i < args.length; i++) {
      String k = args[i].replaceFirst("^-+", "");
      switch (k) {
        case "engine" -> engine = args[++i];
        case "topic" -> topic = args[++i];
        case "mode" -> mode = args[++i];
        case "io-ms" -> ioMs = Long.parseLong(args[++i]);
        case "latency" -> latency = true;
        case "max-tasks" -> maxTasks = Integer.valueOf(args[++i]);
        case "long-poll-ms" -> longPollMs = Long.valueOf(args[++i]);
        case "lock-ms" -> lockMs = Long.valueOf(args[++i]);
        default -> throw new IllegalArgumentException("unknown argument " + args[i]);
      }
    }
    if (topic == null) {
      throw new IllegalArgumentException("-topic is required");
    }

    ExternalTaskClientBuilder b = ExternalTaskClient.create()
        .baseUrl(engine)
        .workerId("java-bench-" + ProcessHandle.current().pid());
    if (maxTasks != null) {
      b.maxTasks(maxTasks);
    }
    if (longPollMs != null) {
      b.asyncResponseTimeout(longPollMs);
    }
    if (lockMs != null) {
      b.lockDuration(lockMs);
    }
    ExternalTaskClient client = b.build();

    PrintStream out = System.out;
    AtomicBoolean first = new AtomicBoolean(true);
    boolean io = "io".equals(mode);
    boolean printPickup = latency;
    long sleep = ioMs;
    TopicSubscriptionBuilder sub = client.subscribe(topic).handler((task, service) -> {
      long t = nowNanos();
      if (first.compareAndSet(true, false)) {
        out.println("FIRST " + t);
        out.flush();
      }
      if (printPickup) {
        out.println("PICKUP " + task.getBusinessKey() + " " + t);
        out.flush();
      }
      if (io) {
        try {
          Thread.sleep(sleep);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          return;
        }
      }
      service.complete(task);
    });
    sub.open();
  }

  private static long nowNanos() {
    Instant now = Instant.now();
    return now.getEpochSecond() * 1_000_000_000L + now.getNano();
  }
}
