//go:build !(linux || darwin)

package main

import "os"

// terminalWidth is 0 here: the demo prints plain progress lines.
func terminalWidth(*os.File) int { return 0 }
