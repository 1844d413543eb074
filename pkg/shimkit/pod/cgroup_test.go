package pod

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/cgroups"
	cgsystemd "github.com/opencontainers/cgroups/systemd"

	"github.com/crisp-runtime/crisp/internal/cgstats"
)

// TestCgroupConfig checks the pod cgroup crisp makes for each driver and cgroup_parent:
// its name as reported (String), where the pause process's cgroup is (as libcontainer
// would make it on a v2 node), and which cgroup SandboxMetrics reads.
func TestCgroupConfig(t *testing.T) {
	const (
		id   = "8f2a"
		uid  = "0c4f1ad3_5a7e_4b1e_9e43_2b1f0d6a7c11"
		pod  = "kubepods-burstable-pod" + uid + ".slice"
		podD = "/kubepods.slice/kubepods-burstable.slice/" + pod
	)
	for _, tc := range []struct {
		name          string
		parent        string
		systemd       bool
		want          CgroupConfig
		str           string // String(): SandboxStatus info, libcontainer's cgroupsPath form
		pause         string // the pause process's cgroup below the hierarchy roots
		metrics       string
		wantInvalid   bool
		wantErrSubstr string
	}{
		{name: "systemd kubelet pod slice", parent: pod, systemd: true,
			want:  CgroupConfig{Driver: DriverSystemd, Slice: pod, Name: id, Parent: pod},
			str:   pod + ":crisp:" + id,
			pause: podD + "/crisp-" + id + ".scope", metrics: podD},
		{name: "systemd guaranteed pod", parent: "kubepods-pod" + uid + ".slice", systemd: true,
			want:  CgroupConfig{Driver: DriverSystemd, Slice: "kubepods-pod" + uid + ".slice", Name: id, Parent: "kubepods-pod" + uid + ".slice"},
			str:   "kubepods-pod" + uid + ".slice:crisp:" + id,
			pause: "/kubepods.slice/kubepods-pod" + uid + ".slice/crisp-" + id + ".scope", metrics: "/kubepods.slice/kubepods-pod" + uid + ".slice"},
		// No cgroup_parent (crictl): system.slice, and the pause scope alone is the pod.
		{name: "systemd default", parent: "", systemd: true,
			want:  CgroupConfig{Driver: DriverSystemd, Slice: "system.slice", Name: id},
			str:   "system.slice:crisp:" + id,
			pause: "/system.slice/crisp-" + id + ".scope", metrics: "/system.slice/crisp-" + id + ".scope"},
		{name: "systemd root slice", parent: "-.slice", systemd: true,
			want:  CgroupConfig{Driver: DriverSystemd, Slice: "-.slice", Name: id, Parent: "-.slice"},
			str:   "-.slice:crisp:" + id,
			pause: "/crisp-" + id + ".scope", metrics: "/"},
		{name: "cgroupfs kubelet pod", parent: "/kubepods/burstable/pod" + uid,
			want:  CgroupConfig{Driver: DriverCgroupfs, Path: "/kubepods/burstable/pod" + uid + "/crisp-" + id, Parent: "/kubepods/burstable/pod" + uid},
			str:   "/kubepods/burstable/pod" + uid + "/crisp-" + id,
			pause: "/kubepods/burstable/pod" + uid + "/crisp-" + id, metrics: "/kubepods/burstable/pod" + uid},
		{name: "cgroupfs default", parent: "",
			want:  CgroupConfig{Driver: DriverCgroupfs, Path: "/crisp/crisp-" + id},
			str:   "/crisp/crisp-" + id,
			pause: "/crisp/crisp-" + id, metrics: "/crisp/crisp-" + id},

		{name: "systemd cgroupfs path", parent: "/kubepods/burstable", systemd: true, wantInvalid: true, wantErrSubstr: "slice name"},
		{name: "systemd not a slice", parent: "kubepods-burstable", systemd: true, wantInvalid: true},
		{name: "systemd slash", parent: "kubepods/x.slice", systemd: true, wantInvalid: true},
		// Characters systemd allows, names it refuses: these passed the character check
		// and failed only later, as an internal error, when the scope was made.
		{name: "systemd double dash", parent: "kubepods--burstable.slice", systemd: true, wantInvalid: true, wantErrSubstr: "invalid slice name"},
		{name: "systemd leading dash", parent: "-kubepods.slice", systemd: true, wantInvalid: true, wantErrSubstr: "invalid slice name"},
		{name: "systemd trailing dash", parent: "kubepods-.slice", systemd: true, wantInvalid: true, wantErrSubstr: "invalid slice name"},
		{name: "cgroupfs slice name", parent: pod, wantInvalid: true, wantErrSubstr: "absolute, clean path"},
		{name: "cgroupfs dot dot", parent: "/kubepods/../x", wantInvalid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := cgroupConfig(id, tc.parent, tc.systemd)
			if tc.wantInvalid {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("cgroupConfig = %+v, %v; want InvalidArgument", got, err)
				}
				if tc.wantErrSubstr != "" && !strings.Contains(err.Error(), tc.wantErrSubstr) {
					t.Errorf("error %q does not say %q", err, tc.wantErrSubstr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("cgroupConfig = %+v, want %+v", got, tc.want)
			}
			if got.String() != tc.str {
				t.Errorf("String = %q, want %q", got.String(), tc.str)
			}
			pause, err := cgstats.RelPath(got.Driver == DriverSystemd, got.Path, got.Slice, cgroupPrefix, got.Name)
			if err != nil || pause != tc.pause {
				t.Errorf("pause cgroup = %q, %v; want %q", pause, err, tc.pause)
			}
			if got.Driver == DriverSystemd {
				// libcontainer's v2 systemd manager names the same scope (its Path
				// needs no dbus).
				m, err := cgsystemd.NewUnifiedManager(&cgroups.Cgroup{Systemd: true, Parent: got.Slice, ScopePrefix: cgroupPrefix, Name: got.Name, Resources: &cgroups.Resources{}}, "")
				if err != nil {
					t.Fatal(err)
				}
				if m.Path("") != "/sys/fs/cgroup"+tc.pause {
					t.Errorf("libcontainer's scope is %q, crisp's %q", m.Path(""), tc.pause)
				}
			}
			if mp, err := got.metricsPath(); err != nil || mp != tc.metrics {
				t.Errorf("metricsPath = %q, %v; want %q", mp, err, tc.metrics)
			}
		})
	}
}
