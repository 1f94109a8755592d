package tasks_test

import (
	"context"
	"fmt"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/tasks"
	"github.com/extworker/extworker/tasks/taskstest"
)

type shipment struct {
	OrderID  string    `var:"orderId"`
	Weight   float64   `var:"weightKg"`
	Express  bool      `var:"express,optional"`
	Deadline time.Time `var:"deadline,optional"`
	Address  struct {
		City string `json:"city"`
	} `var:"address"` // a Json variable
}

// A handler binds its input with Task.Bind, and its topic fetches exactly the variables
// the struct names (VariablesOf). A missing or mistyped variable is a permanent error:
// an incident whose message names it.
func ExampleTask_Bind() {
	ship := func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
		var in shipment
		if err := t.Bind(&in); err != nil {
			return nil, err
		}
		label := fmt.Sprintf("%s to %s, %.1f kg, express %v", in.OrderID, in.Address.City, in.Weight, in.Express)
		return camunda7.Variables{"label": camunda7.StringVar(label)}, nil
	}
	reg := tasks.NewRegistry()
	if err := reg.Register("ship", ship, tasks.TopicOptions{Variables: tasks.VariablesOf[shipment]()}); err != nil {
		panic(err)
	}
	fmt.Println("fetches:", tasks.VariablesOf[shipment]())

	address, _ := camunda7.JSONVar(map[string]string{"city": "Ghent"})
	res, err := taskstest.Handle(context.Background(), reg, taskstest.Task{Topic: "ship", Variables: camunda7.Variables{
		"orderId": camunda7.StringVar("O-1"), "weightKg": camunda7.DoubleVar(2.5), "address": address,
	}})
	if err != nil {
		panic(err)
	}
	label, _ := res.Completed.Variables.String("label")
	fmt.Println(res.Outcome+":", label)

	res, _ = taskstest.Handle(context.Background(), reg, taskstest.Task{Topic: "ship", Variables: camunda7.Variables{
		"orderId": camunda7.LongVar(1), "address": address,
	}})
	fmt.Println(res.Outcome+":", res.Failure.Message)

	// Output:
	// fetches: [orderId weightKg express deadline address]
	// completed: O-1 to Ghent, 2.5 kg, express false
	// incident: permanent: tasks: bind task variables to tasks_test.shipment: field OrderID: camunda7: variable "orderId": has type Long, want String; field Weight: camunda7: variable "weightKg": missing
}
