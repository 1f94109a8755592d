package camunda7_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/extworker/extworker/camunda7"
)

// Building the variables of a request: every variable carries an explicit
// type, Longs keep all their digits and dates use the engine's format.
func ExampleVariables() {
	ist := time.FixedZone("IST", 5*3600+30*60)
	vars := camunda7.Variables{
		"orderId":  camunda7.StringVar("A-1001"),
		"amount":   camunda7.LongVar(9007199254740993),
		"approved": camunda7.BoolVar(true),
		"due":      camunda7.DateVar(time.Date(2024, 3, 1, 17, 0, 0, 0, ist)),
		"token":    camunda7.StringVar("only for this transaction").WithTransient(),
	}
	b, err := json.MarshalIndent(vars, "", "  ")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(b))
	// Output:
	// {
	//   "amount": {
	//     "type": "Long",
	//     "value": 9007199254740993,
	//     "valueInfo": {}
	//   },
	//   "approved": {
	//     "type": "Boolean",
	//     "value": true,
	//     "valueInfo": {}
	//   },
	//   "due": {
	//     "type": "Date",
	//     "value": "2024-03-01T17:00:00.000+0530",
	//     "valueInfo": {}
	//   },
	//   "orderId": {
	//     "type": "String",
	//     "value": "A-1001",
	//     "valueInfo": {}
	//   },
	//   "token": {
	//     "type": "String",
	//     "value": "only for this transaction",
	//     "valueInfo": {
	//       "transient": true
	//     }
	//   }
	// }
}

// Reading variables from an engine response, with errors that name the
// variable and its types but never its value.
func ExampleVariables_Long() {
	response := `{
		"amount":   {"type":"Long","value":9007199254740993,"valueInfo":{}},
		"quantity": {"type":"Integer","value":3,"valueInfo":{}},
		"customer": {"type":"String","value":"Ada Lovelace","valueInfo":{}},
		"discount": {"type":"Long","value":null,"valueInfo":{}}
	}`
	var vars camunda7.Variables
	if err := json.Unmarshal([]byte(response), &vars); err != nil {
		fmt.Println(err)
		return
	}

	amount, err := vars.Long("amount")
	fmt.Println(amount, err)
	quantity, err := vars.Long("quantity") // Short and Integer widen to int64
	fmt.Println(quantity, err)

	_, err = vars.Long("customer")
	fmt.Println(err, errors.Is(err, camunda7.ErrVariableType))
	_, err = vars.Long("discount")
	fmt.Println(err, errors.Is(err, camunda7.ErrVariableNull))
	_, err = vars.Long("shipping")
	fmt.Println(err, errors.Is(err, camunda7.ErrVariableMissing))
	// Output:
	// 9007199254740993 <nil>
	// 3 <nil>
	// camunda7: variable "customer": has type String, want Long true
	// camunda7: variable "discount" (type Long): variable is null true
	// camunda7: variable "shipping": missing true
}

// Json and Object (application/json) variables are read into Go values
// with encoding/json; ObjectVar and JSONVar build them.
func ExampleVariables_JSON() {
	type Order struct {
		ID    string   `json:"id"`
		Items []string `json:"items"`
	}
	order, err := camunda7.ObjectVar("java.util.LinkedHashMap", Order{ID: "A-1001", Items: []string{"book"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	b, _ := json.Marshal(order)
	fmt.Println(string(b))

	// The same text comes back from the engine.
	var vars camunda7.Variables
	_ = json.Unmarshal([]byte(`{"order":`+string(b)+`}`), &vars)
	var got Order
	err = vars.JSON("order", &got)
	fmt.Printf("%+v %v\n", got, err)
	// Output:
	// {"type":"Object","value":"{\"id\":\"A-1001\",\"items\":[\"book\"]}","valueInfo":{"objectTypeName":"java.util.LinkedHashMap","serializationDataFormat":"application/json"}}
	// {ID:A-1001 Items:[book]} <nil>
}

// Decode returns each type as its natural Go type, for code that handles
// variables generically.
func ExampleVariable_Decode() {
	response := `{
		"a": {"type":"Short","value":7,"valueInfo":{}},
		"b": {"type":"Double","value":2.5,"valueInfo":{}},
		"c": {"type":"Date","value":"2024-03-01T08:00:00.000+0100","valueInfo":{}},
		"d": {"type":"Bytes","value":"aGk=","valueInfo":{}},
		"e": {"type":"File","value":null,"valueInfo":{"filename":"r.pdf","mimeType":"application/pdf"}},
		"f": {"type":"Null","value":null,"valueInfo":{}},
		"g": {"type":"Foo","value":1,"valueInfo":{}}
	}`
	var vars camunda7.Variables
	_ = json.Unmarshal([]byte(response), &vars)
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		v, err := vars[name].Decode()
		if err != nil {
			fmt.Println(name, err)
			continue
		}
		switch v := v.(type) {
		case time.Time:
			fmt.Printf("%s %T %s\n", name, v, v.UTC().Format(time.RFC3339))
		case []byte:
			fmt.Printf("%s %T %s\n", name, v, v)
		default:
			fmt.Printf("%s %T %+v\n", name, v, v)
		}
	}
	// Output:
	// a int16 7
	// b float64 2.5
	// c time.Time 2024-03-01T07:00:00Z
	// d []uint8 hi
	// e camunda7.FileValue {Filename:r.pdf MimeType:application/pdf Encoding: Content:[]}
	// f <nil> <nil>
	// g camunda7: variable has type Foo: unknown type
}

// A variable that JSON cannot carry fails when the request is marshalled,
// before anything is sent to the engine.
func ExampleDoubleVar() {
	_, err := json.Marshal(camunda7.Variables{"ratio": camunda7.DoubleVar(math.NaN())})
	fmt.Println(errors.Is(err, camunda7.ErrVariableValue))
	var ve *camunda7.VariableError
	fmt.Println(errors.As(err, &ve), ve.Name)
	// Output:
	// true
	// true ratio
}

// The engine accepts exactly one date format; FormatDate writes it and
// ParseDate reads it (and RFC 3339, for proxies that rewrite dates).
func ExampleFormatDate() {
	t := time.Date(2024, 3, 1, 12, 30, 45, 123456789, time.FixedZone("", -3*3600))
	fmt.Println(camunda7.FormatDate(t))

	parsed, err := camunda7.ParseDate("2024-03-01T12:30:45.123-0300")
	fmt.Println(parsed.Equal(t.Truncate(time.Millisecond)), err)

	_, err = camunda7.ParseDate("01.03.2024")
	fmt.Println(err)
	// Output:
	// 2024-03-01T12:30:45.123-0300
	// true <nil>
	// camunda7: date is not in the engine format yyyy-MM-dd'T'HH:mm:ss.SSSZ (Go layout 2006-01-02T15:04:05.000-0700) or RFC 3339
}
