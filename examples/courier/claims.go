package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/inbox"
)

// damaged is a parcel.damaged event from the carrier.
type damaged struct {
	Shipment string `json:"shipment"`
	Note     string `json:"note"`
}

// claims consumes the carrier's parcel.damaged events from the queue COURIER_CLAIMS and
// opens a claim (the process COURIER_CLAIM_PROCESS) for each damaged shipment, once:
// the inbox records every message before it acts, and the shipment is the claim's
// business key, so a redelivered or replayed event opens nothing twice.
func claims() (inbox.Config, inbox.Decide) {
	process := os.Getenv("COURIER_CLAIM_PROCESS")
	return inbox.Config{Source: "carrier", Queue: os.Getenv("COURIER_CLAIMS")}, func(m inbox.Message) (inbox.Action, error) {
		var d damaged
		if err := json.Unmarshal(m.Body, &d); err != nil || d.Shipment == "" {
			return inbox.Action{}, fmt.Errorf("not a parcel.damaged event with a shipment")
		}
		return inbox.Action{Start: &inbox.Start{ProcessKey: process, BusinessKey: d.Shipment,
			Variables: camunda7.Variables{"shipmentId": camunda7.StringVar(d.Shipment)}}}, nil
	}
}
