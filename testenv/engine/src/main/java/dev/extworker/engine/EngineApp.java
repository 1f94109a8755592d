package dev.extworker.engine;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;

/** Boots the process engine with its REST API; the starter ships no main class. */
@SpringBootApplication
public class EngineApp {
  public static void main(String[] args) {
    SpringApplication.run(EngineApp.class, args);
  }
}
