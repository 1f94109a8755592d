package dev.extworker.engine;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;

/**
 * Boots the process engine with its REST API; the starter ships no main class.
 *
 * <p>ENGINE_REST_AUTH=true turns on HTTP basic authentication for /engine-rest (the
 * "rest-auth" profile: {@link RestAuth} and application-rest-auth.yaml, which creates the
 * user ENGINE_ADMIN_USER with ENGINE_ADMIN_PASSWORD).
 */
@SpringBootApplication
public class EngineApp {
  public static void main(String[] args) {
    SpringApplication app = new SpringApplication(EngineApp.class);
    if ("true".equalsIgnoreCase(System.getenv("ENGINE_REST_AUTH"))) {
      app.setAdditionalProfiles("rest-auth");
    }
    app.run(args);
  }
}
