//go:build linux || darwin

package main

import (
	"os"
	"syscall"
	"unsafe"
)

// terminalWidth is f's columns when f is a terminal, else 0 (a pipe, a file, /dev/null).
func terminalWidth(f *os.File) int {
	var ws struct{ row, col, xpixel, ypixel uint16 }
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TIOCGWINSZ), uintptr(unsafe.Pointer(&ws)))
	if errno != 0 || os.Getenv("TERM") == "dumb" {
		return 0
	}
	if ws.col == 0 {
		return 80 // a terminal that does not say
	}
	return int(ws.col)
}
