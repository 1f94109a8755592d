//go:build !failpoints || !unix

package failpoint

// Enabled reports whether this build has failpoints (the failpoints tag, on Unix).
const Enabled = false

// Inject does nothing: this build has no failpoints.
func Inject(string) {}
