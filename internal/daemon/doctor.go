package daemon

import "crypto/tls"

// EngineTLS is the TLS configuration NewClient uses for the engine (nil: the system
// roots), for `extworker doctor`'s request that reads the engine's clock.
func (c Config) EngineTLS() (*tls.Config, error) { return c.engineTLS() }
