package cri

import (
	"testing"

	"github.com/crisp-runtime/crisp/internal/config"
)

func TestSandboxNetstack(t *testing.T) {
	for _, c := range []struct {
		name string
		rt   config.Runtime
		want bool
	}{
		{"crisp's shim", config.Runtime{Shim: "shim-runc"}, false},
		{"runc task shim", config.Runtime{Shim: "containerd-shim-runc-v2", SandboxMode: "task", Options: map[string]any{"BinaryName": "runc"}}, false},
		{"gVisor options", config.Runtime{Shim: "/opt/gvisor/shim", SandboxMode: "task", Options: map[string]any{"TypeUrl": "io.containerd.runsc.v1.options"}}, true},
		{"gVisor shim without options", config.Runtime{Shim: "/usr/local/bin/containerd-shim-runsc-v1", SandboxMode: "task"}, true},
		{"kata options", config.Runtime{Shim: "containerd-shim-kata-v2", SandboxMode: "task", Options: map[string]any{"TypeUrl": "io.containerd.kata.v2.options"}}, false},
	} {
		if got := isGVisor(c.rt); got != c.want {
			t.Errorf("%s: isGVisor %v, want %v", c.name, got, c.want)
		}
	}
}
