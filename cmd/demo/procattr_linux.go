package main

import "syscall"

// childAttrs puts a child in its own process group, so a Ctrl-C at the
// terminal reaches only the demo, which then stops the child in order, and
// has the kernel kill the child if the demo dies without cleaning up.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
