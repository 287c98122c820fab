//go:build !linux

package redistest

import "syscall"

// childAttrs puts a server in its own process group. Only Linux can also
// kill it when its parent dies.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
