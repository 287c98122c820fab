//go:build !linux

package main

import "syscall"

// childAttrs puts a child in its own process group, so a Ctrl-C at the
// terminal reaches only the demo, which then stops the child in order.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
