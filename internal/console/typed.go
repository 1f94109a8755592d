package console

// The console's rule for what an operator types (field.check, text.go), for the other
// place operators type the same things: `extworker effects resolve`, `approve` and
// `reject` on the command line. One rule, so that the tool never stores what the
// console would refuse (a control character, a byte that is not UTF-8, an invisible
// character), nor the console refuse what the tool stored.

// CheckTypedReason refuses a reason the console's form would refuse.
func CheckTypedReason(s string) error { return fieldReason.check(s) }

// CheckTypedErrorCode refuses a decline's error code the console's form would refuse.
func CheckTypedErrorCode(s string) error { return fieldErrorCode.check(s) }

// CheckTypedProviderRef refuses a provider reference the console's form would refuse.
func CheckTypedProviderRef(s string) error { return fieldProviderRef.check(s) }

// CheckTypedValues refuses result values (NAME=VALUE lines) the console's form would refuse.
func CheckTypedValues(s string) error { return fieldValues.check(s) }
