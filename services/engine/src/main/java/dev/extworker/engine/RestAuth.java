package dev.extworker.engine;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.FilterConfig;
import jakarta.servlet.ServletContext;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import java.io.IOException;
import java.util.Collections;
import java.util.Enumeration;
import java.util.Map;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.context.annotation.Profile;

/**
 * HTTP basic authentication for /engine-rest, in the "rest-auth" profile: the engine's own
 * ProcessEngineAuthenticationFilter with its HttpBasicAuthenticationProvider, as the
 * Camunda docs configure it for Spring Boot.
 *
 * <p>The classes are found by name for the engine that was built (org.camunda, org.operaton
 * or org.cibseven), and the filter is registered as a plain servlet Filter bean, so the
 * same source compiles for every engine and every Spring Boot line.
 */
@Configuration(proxyBeanMethods = false)
@Profile("rest-auth")
public class RestAuth {
  private static final String[] PACKAGES = {"org.camunda", "org.operaton", "org.cibseven"};

  @Bean
  public Filter engineRestAuthentication() throws ReflectiveOperationException {
    for (String p : PACKAGES) {
      String filter = p + ".bpm.engine.rest.security.auth.ProcessEngineAuthenticationFilter";
      try {
        Class<?> c = Class.forName(filter);
        Filter delegate = (Filter) c.getDeclaredConstructor().newInstance();
        return new Only("/engine-rest/", delegate,
            Map.of("authentication-provider", p + ".bpm.engine.rest.security.auth.impl.HttpBasicAuthenticationProvider"));
      } catch (ClassNotFoundException e) {
        // another engine's package
      }
    }
    throw new ClassNotFoundException("no ProcessEngineAuthenticationFilter in " + String.join(", ", PACKAGES));
  }

  /** Runs delegate for requests under prefix, initialised with the given init parameters. */
  static final class Only implements Filter {
    private final String prefix;
    private final Filter delegate;
    private final Map<String, String> params;

    Only(String prefix, Filter delegate, Map<String, String> params) {
      this.prefix = prefix;
      this.delegate = delegate;
      this.params = params;
    }

    @Override
    public void init(FilterConfig config) throws ServletException {
      delegate.init(new FilterConfig() {
        @Override public String getFilterName() { return "engine-rest-authentication"; }
        @Override public ServletContext getServletContext() { return config.getServletContext(); }
        @Override public String getInitParameter(String name) { return params.get(name); }
        @Override public Enumeration<String> getInitParameterNames() { return Collections.enumeration(params.keySet()); }
      });
    }

    @Override
    public void doFilter(ServletRequest req, ServletResponse resp, FilterChain chain) throws IOException, ServletException {
      HttpServletRequest http = (HttpServletRequest) req;
      if (http.getRequestURI().substring(http.getContextPath().length()).startsWith(prefix)) {
        delegate.doFilter(req, resp, chain);
      } else {
        chain.doFilter(req, resp);
      }
    }

    @Override
    public void destroy() {
      delegate.destroy();
    }
  }
}
