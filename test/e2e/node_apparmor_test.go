//lint:file-ignore SA1019 the deprecated apparmor_profile string is still honoured and tested.

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Test profiles: one that lets the container do anything, one that denies writes
// below /tmp. Both allow what a shell and the runtime's signals need.
const (
	aaAllow   = "crisp-test-allow"
	aaDeny    = "crisp-test-deny-write"
	aaMissing = "crisp-test-not-loaded"
)

func aaProfile(name, extra string) string {
	return `#include <tunables/global>
profile ` + name + ` flags=(attach_disconnected,mediate_deleted) {
  #include <abstractions/base>
  file,
  network,
  capability,
  signal,
  ptrace,
  unix,
  mount,
  umount,
  pivot_root,
` + extra + `}
`
}

// TestNodeAppArmor: on a host with AppArmor, crisp's default profile is loaded and
// confines containers that ask for nothing or RuntimeDefault; Localhost profiles are
// enforced; Unconfined containers run unconfined; a profile that is not loaded fails
// the create naming it. Privileged containers get no default profile but are confined
// by a Localhost profile they name, as under containerd. Each through the apparmor
// field, the deprecated apparmor_profile string, and both (the field wins).
func TestNodeAppArmor(t *testing.T) {
	e := newNodeEnv(t)
	ctx := ctxT(t)
	if f := nodeFlavour(); f != "apparmor" {
		t.Skipf("the node VM of flavour %q runs no AppArmor", f)
	}
	if !exists("/sys/kernel/security/apparmor/profiles") {
		t.Fatal("the node VM has no AppArmor: the image or the kernel command line lost it")
	}
	if !aaLoaded(t, "crisp-default") {
		t.Fatal("crisp-default is not loaded although crisp is running")
	}
	if out, _ := exec.Command("criserver", "--config", "/etc/crisp/config.toml", "check").CombinedOutput(); !strings.Contains(string(out), "crisp-default is loaded") {
		t.Errorf("criserver check does not report crisp-default loaded:\n%s", out)
	}
	for name, extra := range map[string]string{aaAllow: "", aaDeny: "  deny /tmp/** w,\n"} {
		path := filepath.Join(e.dir, name)
		if err := os.WriteFile(path, []byte(aaProfile(name, extra)), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("apparmor_parser", "-r", path).CombinedOutput(); err != nil {
			t.Fatalf("load %s: %v: %s", name, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("apparmor_parser", "-R", path).Run() })
	}
	img := e.busybox(ctx)
	kp := e.kubeletPod("apparmor", nil)
	podID := e.runPod(ctx, kp.cfg)

	field := func(k cri.SecurityProfile_ProfileType, ref string) *cri.SecurityProfile {
		return &cri.SecurityProfile{ProfileType: k, LocalhostRef: ref}
	}
	const (
		def   = cri.SecurityProfile_RuntimeDefault
		unc   = cri.SecurityProfile_Unconfined
		local = cri.SecurityProfile_Localhost
	)
	for _, tc := range []aaCase{
		{"unset", nil, "", "crisp-default (enforce)", true},
		{"field-runtime-default", field(def, ""), "", "crisp-default (enforce)", true},
		{"string-runtime-default", nil, "runtime/default", "crisp-default (enforce)", true},
		{"field-unconfined", field(unc, ""), "", "unconfined", true},
		{"string-unconfined", nil, "unconfined", "unconfined", true},
		{"field-deny", field(local, aaDeny), "", aaDeny + " (enforce)", false},
		{"field-deny-prefixed", field(local, "localhost/"+aaDeny), "", aaDeny + " (enforce)", false},
		{"string-deny", nil, "localhost/" + aaDeny, aaDeny + " (enforce)", false},
		{"field-allow", field(local, aaAllow), "", aaAllow + " (enforce)", true},
		{"string-allow", nil, "localhost/" + aaAllow, aaAllow + " (enforce)", true},
		{"both-field-wins", field(local, aaAllow), "localhost/" + aaDeny, aaAllow + " (enforce)", true},
		{"both-field-unconfined-wins", field(unc, ""), "localhost/" + aaDeny, "unconfined", true},
	} {
		t.Run(tc.name, func(t *testing.T) { e.aaRun(t, podID, kp.cfg, img, false, tc) })
	}

	for _, tc := range []struct {
		name  string
		field *cri.SecurityProfile
		str   string
	}{
		{"field-not-loaded", field(local, aaMissing), ""},
		{"string-not-loaded", nil, "localhost/" + aaMissing},
	} {
		t.Run(tc.name, func(t *testing.T) { e.aaNotLoaded(t, podID, kp.cfg, img, false, tc.name, tc.field, tc.str) })
	}

	// crisp-default removed behind crisp's back (aa-teardown, a reload) is loaded
	// again by the next container that needs it. Each phase has its own deadline.
	ctx = ctxT(t)
	if err := os.WriteFile("/sys/kernel/security/apparmor/.remove", []byte("crisp-default"), 0o200); err != nil {
		t.Fatalf("unload crisp-default: %v", err)
	}
	if aaLoaded(t, "crisp-default") {
		t.Fatal("crisp-default still loaded after its removal")
	}
	id := e.runCtr(ctx, podID, kp.cfg, ctrConfig("reloaded", img, "sleep", "3600"))
	if got := aaSettled(t, e.ctrPid(ctx, id), "crisp-default (enforce)"); got != "crisp-default (enforce)" {
		t.Errorf("after the profile was removed, a new container runs as %q", got)
	}
	e.stopRemove(ctx, t, podID)

	// Privileged containers: the runtime's default for them is unconfined (unset,
	// RuntimeDefault), but a Localhost profile they name confines them like anyone,
	// and one that is not loaded fails their create (containerd 2.x; crisp ignored it
	// before).
	ctx = ctxT(t)
	pkp := e.kubeletPod("apparmor-priv", nil)
	pkp.cfg.Linux.SecurityContext.Privileged = true
	privPod := e.runPod(ctx, pkp.cfg)
	for _, tc := range []aaCase{
		{"privileged-unset", nil, "", "unconfined", true},
		{"privileged-field-runtime-default", field(def, ""), "", "unconfined", true},
		{"privileged-string-runtime-default", nil, "runtime/default", "unconfined", true},
		{"privileged-field-unconfined", field(unc, ""), "", "unconfined", true},
		{"privileged-field-deny", field(local, aaDeny), "", aaDeny + " (enforce)", false},
		{"privileged-string-deny", nil, "localhost/" + aaDeny, aaDeny + " (enforce)", false},
		{"privileged-field-allow", field(local, aaAllow), "", aaAllow + " (enforce)", true},
	} {
		t.Run(tc.name, func(t *testing.T) { e.aaRun(t, privPod, pkp.cfg, img, true, tc) })
	}
	t.Run("privileged-field-not-loaded", func(t *testing.T) {
		e.aaNotLoaded(t, privPod, pkp.cfg, img, true, "privileged-not-loaded", field(local, aaMissing), "")
	})
	e.stopRemove(ctx, t, privPod)
}

// TestE2EAppArmorOffPrivileged: with AppArmor off (disable_apparmor, so on any host)
// the outcome depends only on whether crisp can give what was asked, as it does with
// AppArmor on: a privileged container's RuntimeDefault, which would run unconfined
// there too, runs; a Localhost profile, privileged or not, and a non-privileged
// RuntimeDefault are refused with FailedPrecondition rather than run without it.
func TestE2EAppArmorOffPrivileged(t *testing.T) {
	e := newEnv(t)
	cfg, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.cfgPath, append([]byte("disable_apparmor = true\n"), cfg...), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("aa-off")
	pod.Linux.SecurityContext.Privileged = true
	podID := e.runPod(ctx, pod)
	for _, tc := range []struct {
		name       string
		privileged bool
		sp         *cri.SecurityProfile
		refused    bool
	}{
		{"privileged-runtime-default", true, &cri.SecurityProfile{ProfileType: cri.SecurityProfile_RuntimeDefault}, false},
		{"privileged-unconfined", true, &cri.SecurityProfile{ProfileType: cri.SecurityProfile_Unconfined}, false},
		{"privileged-localhost", true, &cri.SecurityProfile{ProfileType: cri.SecurityProfile_Localhost, LocalhostRef: aaDeny}, true},
		{"runtime-default", false, &cri.SecurityProfile{ProfileType: cri.SecurityProfile_RuntimeDefault}, true},
		{"localhost", false, &cri.SecurityProfile{ProfileType: cri.SecurityProfile_Localhost, LocalhostRef: aaDeny}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ctrConfig(tc.name, img, "sleep", "3600")
			c.Linux.SecurityContext.Privileged = tc.privileged
			c.Linux.SecurityContext.Apparmor = tc.sp
			resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: c, SandboxConfig: pod})
			if tc.refused {
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "AppArmor is not enabled") {
					t.Errorf("create: %v; want FailedPrecondition saying AppArmor is not enabled", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
				t.Errorf("start: %v", err)
			}
			if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: resp.ContainerId}); err != nil {
				t.Errorf("remove: %v", err)
			}
		})
	}
	e.stopRemove(ctx, t, podID)
}

// aaCase is a container's AppArmor request and what it must run as.
type aaCase struct {
	name  string
	field *cri.SecurityProfile
	str   string // the deprecated apparmor_profile
	want  string // attr/current, as the host and the container see it
	// canWrite: writing below /tmp works (the deny-write profile refuses it).
	canWrite bool
}

// aaRun runs a container with tc's request in the pod and checks its confinement from
// the host and from inside (an exec, which gets the container's profile): its label,
// and a write below /tmp that the deny-write profile refuses. Each case has its own
// deadline: under the node VM's emulation the whole test takes longer than one.
func (e *env) aaRun(t *testing.T, podID string, pod *cri.PodSandboxConfig, img string, privileged bool, tc aaCase) {
	ctx := ctxT(t)
	cfg := ctrConfig(tc.name, img, "sleep", "3600")
	cfg.Linux.SecurityContext.Privileged = privileged
	cfg.Linux.SecurityContext.Apparmor = tc.field
	cfg.Linux.SecurityContext.ApparmorProfile = tc.str
	id := e.runCtr(ctx, podID, pod, cfg)
	defer func() {
		if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Errorf("RemoveContainer: %v", err)
		}
	}()
	if got := aaSettled(t, e.ctrPid(ctx, id), tc.want); got != tc.want {
		t.Errorf("container runs as %q, want %q", got, tc.want)
	}
	if out := strings.TrimSpace(strings.TrimRight(e.mustExec(ctx, t, id, "cat", "/proc/self/attr/current"), "\x00\n")); out != tc.want {
		t.Errorf("exec runs as %q, want %q", out, tc.want)
	}
	resp, err := e.execSync(ctx, id, 30, "sh", "-c", "echo x > /tmp/x")
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if wrote := resp.ExitCode == 0; wrote != tc.canWrite {
		t.Errorf("write to /tmp: exit %d stderr %q; want it to succeed: %v", resp.ExitCode, resp.Stderr, tc.canWrite)
	}
}

// aaNotLoaded checks that a container naming a profile that is not loaded is not
// created: FailedPrecondition naming the profile.
func (e *env) aaNotLoaded(t *testing.T, podID string, pod *cri.PodSandboxConfig, img string, privileged bool, name string, field *cri.SecurityProfile, str string) {
	ctx := ctxT(t)
	cfg := ctrConfig(name, img, "sleep", "3600")
	cfg.Linux.SecurityContext.Privileged = privileged
	cfg.Linux.SecurityContext.Apparmor = field
	cfg.Linux.SecurityContext.ApparmorProfile = str
	_, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), aaMissing) {
		t.Errorf("create with a profile that is not loaded: %v; want FailedPrecondition naming %s", err, aaMissing)
	}
}

// aaCurrent is a process's AppArmor confinement as the host sees it.
func aaCurrent(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "attr/current"))
	if err != nil {
		t.Fatalf("AppArmor label of pid %d: %v", pid, err)
	}
	return strings.TrimSpace(strings.TrimRight(string(data), "\x00"))
}

// aaSettled is a container's confinement once its process has been exec'd: runc
// applies the profile at the execve of the container's process, which may come a
// little after StartContainer returns (runc init runs unconfined until then). It
// waits up to 10 s for want and returns what it last read.
func aaSettled(t *testing.T, pid int, want string) string {
	t.Helper()
	got := aaCurrent(t, pid)
	for deadline := time.Now().Add(10 * time.Second); got != want && time.Now().Before(deadline); got = aaCurrent(t, pid) {
		time.Sleep(100 * time.Millisecond)
	}
	return got
}

// aaLoaded reports whether a profile is loaded in the kernel.
func aaLoaded(t *testing.T, name string) bool {
	t.Helper()
	data, err := os.ReadFile("/sys/kernel/security/apparmor/profiles")
	if err != nil {
		t.Fatalf("loaded AppArmor profiles: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, name+" (") {
			return true
		}
	}
	return false
}
