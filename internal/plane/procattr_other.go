//go:build !linux

package plane

import (
	"path/filepath"
	"syscall"
)

// Elsewhere the children are stopped by Stop only.
func childAttrs() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func (p *Plane) wrapDeathSignal(name string) (string, error) {
	return filepath.Join(p.AssetsDir, name), nil
}

func childPID(string) int { return 0 }

// RSS is unknown off Linux.
func RSS(int) int64 { return 0 }
