package testenv

import (
	"context"
	"encoding/xml"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/extworker/extworker/camunda7/admin"
)

// UserTaskProcess is a process that waits in one user task: start → the task → end.
type UserTaskProcess struct {
	// Key is the process definition key; default Unique("approval").
	Key string
	// TaskID is the user task's activity id (its task definition key); default "approve".
	TaskID string
	// Name is the task's name; default none.
	Name string
	// CandidateUsers and CandidateGroups are the task's candidates.
	CandidateUsers, CandidateGroups []string
	// FormFields are the task's declared form fields (camunda:formData); none: no
	// formData.
	FormFields []FormField
}

// FormField is a camunda:formField: its id, type (string, long, boolean, date, enum)
// and default value ("" none).
type FormField struct {
	ID, Type, Default string
}

// DeployUserTask deploys p and deletes it (cascading to its instances) at cleanup; it
// returns p with its defaults filled in.
func DeployUserTask(t testing.TB, c *admin.Client, p UserTaskProcess) UserTaskProcess {
	t.Helper()
	if p.Key == "" {
		p.Key = Unique("approval")
	}
	if p.TaskID == "" {
		p.TaskID = "approve"
	}
	res, err := c.Deploy(Context(t, 30*time.Second), admin.Deployment{Name: p.Key,
		Resources: []admin.Resource{{Name: p.Key + ".bpmn", Content: []byte(p.bpmn())}}})
	if err != nil {
		t.Fatalf("deploy %s: %v", p.Key, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.DeleteDeployment(ctx, res.ID, true); err != nil {
			t.Logf("cleanup: delete deployment %s: %v", res.ID, err)
		}
	})
	return p
}

func (p UserTaskProcess) bpmn() string {
	attr := func(name, v string) string {
		if v == "" {
			return ""
		}
		var b strings.Builder
		_ = xml.EscapeText(&b, []byte(v))
		return fmt.Sprintf(` %s="%s"`, name, b.String())
	}
	task := attr("id", p.TaskID) + attr("name", p.Name) +
		attr("camunda:candidateUsers", strings.Join(p.CandidateUsers, ",")) +
		attr("camunda:candidateGroups", strings.Join(p.CandidateGroups, ","))
	body := ""
	if len(p.FormFields) > 0 {
		body = "<bpmn:extensionElements><camunda:formData>"
		for _, f := range p.FormFields {
			body += "<camunda:formField" + attr("id", f.ID) + attr("type", f.Type) + attr("defaultValue", f.Default) + "/>"
		}
		body += "</camunda:formData></bpmn:extensionElements>"
	}
	return fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
  id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="%[2]s"/>
    <bpmn:userTask%[3]s>%[4]s</bpmn:userTask>
    <bpmn:sequenceFlow id="f2" sourceRef="%[2]s" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>`, p.Key, p.TaskID, task, body)
}
