package main

import (
	"testing"

	"github.com/crisp-runtime/crisp/internal/config"
)

// TestPackagedConfig: /etc/crisp/config.toml as the Debian package installs it loads,
// uses Debian's CNI plugin dir and names a shim criserver finds next to itself in
// /usr/bin (a bare name, not a path into a build dir).
func TestPackagedConfig(t *testing.T) {
	cfg, err := config.Load("../../packaging/deb/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Runtimes["runc"].Shim; got != "shim-runc" {
		t.Errorf("runtimes.runc.shim = %q, want shim-runc", got)
	}
	if len(cfg.CNI.BinDirs) != 1 || cfg.CNI.BinDirs[0] != "/usr/lib/cni" {
		t.Errorf("cni.bin_dirs = %v, want [/usr/lib/cni]", cfg.CNI.BinDirs)
	}
	if cfg.Socket != config.Default().Socket {
		t.Errorf("socket = %s, want the default %s (crictl.yaml and the README name it)", cfg.Socket, config.Default().Socket)
	}
}
