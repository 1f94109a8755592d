package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/extworkertest"
)

// processBPMN is the process the handler serves: book a courier for a shipment; an
// address the courier refuses ends on its own path.
const processBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
                  id="courier" targetNamespace="http://example.com/courier">
  <bpmn:error id="Rejected" name="Address rejected" errorCode="ADDRESS_REJECTED"/>
  <bpmn:process id="%s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="book"/>
    <bpmn:serviceTask id="book" camunda:type="external" camunda:topic="` + bookTopic + `"/>
    <bpmn:sequenceFlow id="f2" sourceRef="book" targetRef="booked"/>
    <bpmn:endEvent id="booked"/>
    <bpmn:boundaryEvent id="rejected" attachedToRef="book"><bpmn:errorEventDefinition errorRef="Rejected"/></bpmn:boundaryEvent>
    <bpmn:sequenceFlow id="f3" sourceRef="rejected" targetRef="undeliverable"/>
    <bpmn:endEvent id="undeliverable"/>
  </bpmn:process>
</bpmn:definitions>`

// The program's setup, against the engine at EXTWORKER_ENGINE_URL and the ledger at
// EXTWORKER_DATABASE_URL (skipped without them, failed under CI=true): each shipment
// booked once, a twin delivery of one shipment too, and a refused address on the
// process's error path.
func TestBookCourierOnTheEngine(t *testing.T) {
	c := extworkertest.Engine(t)
	prov, cour := startCourier(t)
	t.Setenv("COURIER_URL", cour.URL)
	key := extworkertest.Unique("courier")
	extworkertest.Deploy(t, c, key, []byte(fmt.Sprintf(processBPMN, key)))
	extworkertest.Start(t, extworker.Options{}, setup)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := extworkertest.Unique("S")
	start := func(shipment, postcode string) string {
		pi, err := c.StartProcess(ctx, key, admin.StartProcessRequest{BusinessKey: shipment,
			Variables: camunda7.Variables{"shipmentId": camunda7.StringVar(shipment), "postcode": camunda7.StringVar(postcode)}})
		if err != nil {
			t.Fatal(err)
		}
		return pi.ID
	}
	ids := map[string]string{"first": start(run+"-1", "10115"), "second": start(run+"-2", "80331"),
		"twin": start(run+"-1", "10115"), "refused": start(run+"-3", "00000")}
	for _, name := range []string{"first", "second", "twin"} {
		assert.Equal(t, []string{"booked"}, extworkertest.WaitEnded(t, c, ids[name], time.Minute), name)
	}
	assert.Equal(t, []string{"undeliverable"}, extworkertest.WaitEnded(t, c, ids["refused"], time.Minute))
	assert.Equal(t, 2, prov.booked(), "one booking per shipment, the twin included")
}
