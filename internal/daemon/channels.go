package daemon

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The outbox relay's brokers (Config.OutboxBroker).
const (
	OutboxAMQP  = "amqp"
	OutboxKafka = "kafka"
)

// Outbox is where this process's relay publishes: OutboxAMQP, OutboxKafka, or "" (no
// relay), from OutboxBroker, or else from which broker is configured.
func (c Config) Outbox() string {
	switch {
	case c.OutboxBroker != "":
		return c.OutboxBroker
	case c.AMQPURL != "":
		return OutboxAMQP
	case len(c.KafkaBrokers) > 0:
		return OutboxKafka
	}
	return ""
}

// channelProblems checks the Kafka brokers, the outbox's broker and the callbacks'
// listener.
func (c Config) channelProblems() []error {
	var errs []error
	for _, b := range c.KafkaBrokers {
		host, port, err := net.SplitHostPort(b)
		n, perr := strconv.Atoi(port)
		switch {
		case err != nil || host == "" || perr != nil || n < 1 || n > 65535:
			errs = append(errs, fmt.Errorf("EXTWORKER_KAFKA_BROKERS %q: want host:port, the port 1 to 65535", b))
		case !c.KafkaTLS && !c.KafkaAllowPlaintext && !loopbackHost(host):
			errs = append(errs, fmt.Errorf("EXTWORKER_KAFKA_BROKERS %q: events would travel in clear to a host that is not loopback: "+
				"set EXTWORKER_KAFKA_TLS=true, or EXTWORKER_KAFKA_ALLOW_PLAINTEXT=true", b))
		}
	}
	if len(c.KafkaBrokers) > 0 && (c.KafkaSessionTimeout < 6*time.Second || c.KafkaSessionTimeout > 5*time.Minute) {
		errs = append(errs, fmt.Errorf("EXTWORKER_KAFKA_SESSION_TIMEOUT %v: want 6s (the broker's least, by default) to 5m", c.KafkaSessionTimeout))
	}
	switch c.OutboxBroker {
	case "":
	case OutboxAMQP:
		if c.AMQPURL == "" {
			errs = append(errs, errors.New("EXTWORKER_OUTBOX_BROKER=amqp needs EXTWORKER_AMQP_URL"))
		}
	case OutboxKafka:
		if len(c.KafkaBrokers) == 0 {
			errs = append(errs, errors.New("EXTWORKER_OUTBOX_BROKER=kafka needs EXTWORKER_KAFKA_BROKERS"))
		}
	default:
		errs = append(errs, fmt.Errorf("EXTWORKER_OUTBOX_BROKER %q: want amqp or kafka", c.OutboxBroker))
	}
	if c.CallbackAddr != "" {
		if _, _, err := net.SplitHostPort(c.CallbackAddr); err != nil {
			errs = append(errs, fmt.Errorf("EXTWORKER_CALLBACK_ADDR %q: want host:port: %w", c.CallbackAddr, err))
		}
		if c.CallbackTolerance <= 0 || c.CallbackTolerance > time.Hour || c.CallbackMaxBody <= 0 {
			errs = append(errs, fmt.Errorf("EXTWORKER_CALLBACK_TOLERANCE %v and EXTWORKER_CALLBACK_MAX_BODY %d: the tolerance from 1s to 1h "+
				"(beyond, a captured callback could be sent again long after: the scheme suggests 5m), the body cap positive", c.CallbackTolerance, c.CallbackMaxBody))
		}
	}
	return errs
}

// KafkaOptions are the franz-go options for the configured brokers beyond their
// addresses: TLS (verified) with KafkaTLS.
func (c Config) KafkaOptions() []kgo.Opt {
	if !c.KafkaTLS {
		return nil
	}
	return []kgo.Opt{kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12})}
}

// CallbackSecretsVar is the variable holding source's callback signing secrets:
// EXTWORKER_CALLBACK_SECRETS_ and the source in upper case, each character that is not
// a letter or a digit an underscore.
func CallbackSecretsVar(source string) string {
	return envPrefix + "CALLBACK_SECRETS_" + strings.Map(func(r rune) rune {
		if r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			return unicode.ToUpper(r)
		}
		return '_'
	}, source)
}

// CallbackSecrets reads source's signing secrets (space-separated) from
// CallbackSecretsVar(source), or from the file its _FILE names; none is an error.
func CallbackSecrets(source string) ([]string, error) {
	name := CallbackSecretsVar(source)
	v, inVar := os.LookupEnv(name)
	path, inFile := os.LookupEnv(name + "_FILE")
	switch {
	case inVar && inFile:
		return nil, fmt.Errorf("%s and %s_FILE are both set: choose one", name, name)
	case inFile:
		var err error
		if v, err = readSecretFile(path); err != nil {
			return nil, fmt.Errorf("%s_FILE: %w", name, err)
		}
	}
	secrets := strings.Fields(v)
	if len(secrets) == 0 {
		return nil, fmt.Errorf("the callbacks of source %q need their signing secrets in %s (or %s_FILE): whsec_ keys, space-separated", source, name, name)
	}
	return secrets, nil
}
