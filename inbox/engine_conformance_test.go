package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox/inboxtest"
	"github.com/extworker/extworker/internal/testenv"
)

// conformanceBPMN is a process that waits for a message, then at a user task until it
// is ended: what inboxtest.Engine's Deploy models.
const conformanceBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
  id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:message id="Msg_%[1]s" name="%[2]s"/>
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="wait"/>
    <bpmn:intermediateCatchEvent id="wait"><bpmn:messageEventDefinition messageRef="Msg_%[1]s"/></bpmn:intermediateCatchEvent>
    <bpmn:sequenceFlow id="f2" sourceRef="wait" targetRef="hold"/>
    <bpmn:userTask id="hold"/>
    <bpmn:sequenceFlow id="f3" sourceRef="hold" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>`

// TestEngineConformanceReal runs the engine's behaviour suite (package inboxtest)
// against the real engine, the truth inboxtest.Engine is held to: processes deployed
// through the REST API, instances ended by deleting them.
func TestEngineConformanceReal(t *testing.T) {
	testenv.Engine(t) // skips (or, with CI=true, fails) without an engine
	const timeout = 2 * time.Second
	engine := admin.New(quickClient(t, testenv.EngineURL(), timeout))
	inboxtest.RunEngineSuite(t, inboxtest.Harness{Engine: engine, Timeout: timeout,
		Deploy: func(t *testing.T, key, message string) {
			t.Helper()
			ctx := testenv.Context(t, 30*time.Second)
			res, err := engine.Deploy(ctx, admin.Deployment{Name: key, Resources: []admin.Resource{{Name: key + ".bpmn",
				Content: []byte(fmt.Sprintf(conformanceBPMN, key, message))}}})
			if err != nil {
				t.Fatalf("deploy %s: %v", key, err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = engine.DeleteDeployment(ctx, res.ID, true)
			})
		},
		End: func(t *testing.T, id string) {
			t.Helper()
			if err := engine.DeleteProcessInstance(testenv.Context(t, 30*time.Second), id); err != nil {
				t.Fatalf("end %s: %v", id, err)
			}
		}})
}
