package redistest

import "syscall"

// childAttrs puts a server in its own process group, so a Ctrl-C at a
// terminal reaches only the program that started it, and has the kernel
// kill the server if that program dies without stopping it.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
