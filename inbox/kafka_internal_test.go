package inbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCheckTopic: a topic Kafka would refuse is a configuration error at NewKafkaConsumer
// (it was a WARN in a loop at Run).
func TestCheckTopic(t *testing.T) {
	for topic, ok := range map[string]bool{
		"invoice.paid": true, "a_b-C.9": true, strings.Repeat("t", 243): true,
		strings.Repeat("t", 244): false, "bad topic!": false, "a/b": false, ".": false, "..": false, "é": false,
	} {
		assert.Equal(t, ok, checkTopic(topic) == nil, "%q", topic)
	}
}
