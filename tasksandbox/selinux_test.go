package tasksandbox

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	options "github.com/crisp-runtime/crisp/api/options/v1"
)

// TestPauseSpecSELinux: the pause container's spec carries the pod's mount label, and
// its process label only when the pause binary has the pod's file type (the only
// entrypoint the container policies give the container type); a binary of another
// label, or none (no SELinux), leaves the pause in the shim's domain.
func TestPauseSpecSELinux(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "shim-runc")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const proc, mnt = "system_u:system_r:container_t:s0:c1,c2", "system_u:object_r:container_file_t:s0:c1,c2"
	p := PauseBundle{ID: "p1", Binary: bin, Options: &options.SandboxOptions{SelinuxLabel: proc, MountLabel: mnt}}
	s, err := p.spec()
	if err != nil {
		t.Fatal(err)
	}
	if s.Linux.MountLabel != mnt {
		t.Errorf("mount label %q, want %q", s.Linux.MountLabel, mnt)
	}
	if s.Process.SelinuxLabel != "" {
		t.Errorf("process label %q for a binary that is no container file", s.Process.SelinuxLabel)
	}
	// A binary labelled with the pod's file type (the xattr is stored on a host without
	// SELinux too, as setfiles stores it): the pause takes the pod's label.
	if err := unix.Setxattr(bin, "security.selinux", []byte("system_u:object_r:container_file_t:s0\x00"), 0); err != nil {
		t.Logf("cannot label %s (%v): the labelled case is left to the SELinux node VM", bin, err)
	} else if s, err = p.spec(); err != nil || s.Process.SelinuxLabel != proc {
		t.Errorf("pause of a container_file_t binary: process label %q (%v), want %q", s.Process.SelinuxLabel, err, proc)
	}
	p.Options = &options.SandboxOptions{}
	if s, err = p.spec(); err != nil || s.Process.SelinuxLabel != "" || s.Linux.MountLabel != "" {
		t.Errorf("labels without SELinux: %q %q %v", s.Process.SelinuxLabel, s.Linux.MountLabel, err)
	}
}
