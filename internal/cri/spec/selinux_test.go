package spec

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	testProcessLabel = "system_u:system_r:container_t:s0:c1,c2"
	testMountLabel   = "system_u:object_r:container_file_t:s0:c1,c2"
)

// TestGenerateSELinuxLabels: the labels the caller allocated are the process's and
// the mounts' (containerd's WithSelinuxLabels), a privileged container runs without
// its process label but keeps the mount label, and no warning is given.
func TestGenerateSELinuxLabels(t *testing.T) {
	in := baseInput(t)
	in.ProcessLabel, in.MountLabel = testProcessLabel, testMountLabel
	sc(in).SelinuxOptions = &runtime.SELinuxOption{Level: "s0:c1,c2"}
	res := mustGenerate(t, in)
	equal(t, "process label", res.Spec.Process.SelinuxLabel, testProcessLabel)
	equal(t, "mount label", res.Spec.Linux.MountLabel, testMountLabel)
	for _, w := range res.Warnings {
		if strings.Contains(w, "SELinux") {
			t.Errorf("warning with labels applied: %q", w)
		}
	}

	sc(in).Privileged = true
	in.Pod.Linux.SecurityContext.Privileged = true
	res = mustGenerate(t, in)
	equal(t, "privileged process label", res.Spec.Process.SelinuxLabel, "")
	equal(t, "privileged mount label", res.Spec.Linux.MountLabel, testMountLabel)
}

// TestGenerateSELinuxOff: without labels the spec has none, options are ignored with a
// warning and selinux_relabel asks for nothing, even of a system path (as containerd
// with SELinux off).
func TestGenerateSELinuxOff(t *testing.T) {
	in := baseInput(t)
	sc(in).SelinuxOptions = &runtime.SELinuxOption{Type: "spc_t"}
	in.Config.Mounts = []*runtime.Mount{{ContainerPath: "/host", HostPath: "/", SelinuxRelabel: true, Readonly: true}}
	res := mustGenerate(t, in)
	equal(t, "process label", res.Spec.Process.SelinuxLabel, "")
	equal(t, "mount label", res.Spec.Linux.MountLabel, "")
	if len(res.Relabel) != 0 {
		t.Errorf("relabel without SELinux: %v", res.Relabel)
	}
	if !slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.HasPrefix(w, "SELinux options ignored") }) {
		t.Errorf("no warning for ignored SELinux options: %q", res.Warnings)
	}
}

// TestGenerateSELinuxRelabel: mounts with selinux_relabel are handed back to relabel,
// resolved; others are not; a system directory is refused with InvalidArgument, also
// behind a symlink.
func TestGenerateSELinuxRelabel(t *testing.T) {
	dir := t.TempDir()
	vol := filepath.Join(dir, "vol")
	other := filepath.Join(dir, "other")
	for _, d := range []string{vol, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(vol, link); err != nil {
		t.Fatal(err)
	}
	in := baseInput(t)
	in.ProcessLabel, in.MountLabel = testProcessLabel, testMountLabel
	in.Config.Mounts = []*runtime.Mount{
		{ContainerPath: "/data", HostPath: link, SelinuxRelabel: true},
		{ContainerPath: "/other", HostPath: other},
	}
	res := mustGenerate(t, in)
	equal(t, "relabel", res.Relabel, []string{vol})

	etcLink := filepath.Join(dir, "etc")
	if err := os.Symlink("/etc", etcLink); err != nil {
		t.Fatal(err)
	}
	for _, hp := range []string{"/", "/usr", "/etc/", "/var/lib", etcLink} {
		in.Config.Mounts = []*runtime.Mount{{ContainerPath: "/host", HostPath: hp, SelinuxRelabel: true, Readonly: true}}
		_, err := Generate(in)
		wantErr(t, err, isInvalid, "is a system directory and cannot be relabelled for SELinux")
	}
	// The same paths without selinux_relabel are ordinary mounts.
	in.Config.Mounts = []*runtime.Mount{{ContainerPath: "/host", HostPath: "/usr", Readonly: true}}
	mustGenerate(t, in)
}
