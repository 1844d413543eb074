package e2e

import (
	"github.com/crisp-runtime/crisp/internal/testutil"

	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/version"
)

// packageFiles are what the package installs; all of them must go with dpkg -r,
// except the conffile, which goes with dpkg --purge.
var packageFiles = []string{
	"/usr/bin/criserver",
	"/usr/bin/shim-runc",
	"/usr/bin/containerd-shim-crisp-v1",
	"/usr/bin/shim-wasm",
	"/lib/systemd/system/crisp.service",
	"/usr/share/doc/crisp/README.md",
	"/usr/share/doc/crisp/copyright",
	"/usr/share/doc/crisp/examples/crictl.yaml",
	"/usr/share/man/man8/criserver.8.gz",
	"/usr/share/man/man8/shim-runc.8.gz",
	"/usr/share/man/man8/containerd-shim-crisp-v1.8.gz",
	"/usr/share/man/man8/shim-wasm.8.gz",
	"/usr/share/man/man5/crisp-config.toml.5.gz",
	"/usr/share/crisp/selinux/crisp.cil",
	"/usr/lib/tmpfiles.d/crisp.conf",
}

const packageConffile = "/etc/crisp/config.toml"

func repoRoot() string { return testutil.RepoRoot() }

// systemdLeftovers lists what deb-systemd-helper keeps of crisp.service (enablement
// links, masks, state files), so the test can check purge leaves none.
func systemdLeftovers() []string {
	var out []string
	for _, root := range []string{"/etc/systemd/system", "/var/lib/systemd/deb-systemd-helper-enabled", "/var/lib/systemd/deb-systemd-helper-masked"} {
		_ = filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
			if err == nil && strings.Contains(filepath.Base(p), "crisp") {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// TestE2EPackage builds the .deb with `make deb`, installs it on this machine with
// dpkg -i, checks the unit with systemd-analyze, runs the installed criserver with the
// installed config (socket, dirs and network moved to temp places) through a pod whose
// shim is the installed one, then removes and purges the package and checks that
// nothing of it is left.
func TestE2EPackage(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	for _, tool := range []string{"dpkg", "dpkg-deb", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: the package test needs Debian's dpkg", tool)
		}
	}
	// Never touch an installation that is not the test's own.
	if exec.Command("dpkg", "-s", "crisp").Run() == nil {
		t.Skip("a crisp package is installed on this machine: not replacing it")
	}
	for _, p := range append(append([]string{}, packageFiles...), packageConffile) {
		if _, err := os.Lstat(p); err == nil {
			t.Skipf("%s exists outside the package: not overwriting it", p)
		}
	}
	if left := systemdLeftovers(); len(left) > 0 {
		t.Skipf("crisp.service state exists on this machine (%v): not touching it", left)
	}

	debDir := t.TempDir()
	mk := exec.Command("make", "-s", "deb", "BINDIR="+debDir, "DEBDIR="+debDir, "VERSION="+version.Version)
	mk.Dir = repoRoot()
	out, err := mk.CombinedOutput()
	if err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	deb := lines[len(lines)-1]
	wantDebVersion := strings.ReplaceAll(version.Version, "-", "~")
	if got, err := exec.Command("dpkg-deb", "-f", deb, "Version").Output(); err != nil || strings.TrimSpace(string(got)) != wantDebVersion {
		t.Fatalf("package version %q (%v), want %q", got, err, wantDebVersion)
	}
	if got, _ := exec.Command("dpkg-deb", "-f", deb, "Depends").Output(); !containsAll(string(got), "containernetworking-plugins", "iptables", "libseccomp2") {
		t.Errorf("Depends: %s", got)
	}

	t.Cleanup(func() {
		// Whatever happened, the machine is left as found.
		if exec.Command("dpkg", "-s", "crisp").Run() == nil {
			if out, err := exec.Command("dpkg", "--purge", "crisp").CombinedOutput(); err != nil {
				t.Errorf("dpkg --purge crisp: %v\n%s", err, out)
			}
		}
	})
	if out, err := exec.Command("dpkg", "-i", deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -i: %v\n%s", err, out)
	}
	for _, p := range append(append([]string{}, packageFiles...), packageConffile) {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("after dpkg -i: %v", err)
		}
	}
	if l, err := os.Readlink("/usr/bin/containerd-shim-crisp-v1"); err != nil || l != "shim-runc" {
		t.Errorf("containerd-shim-crisp-v1 -> %q (%v), want shim-runc", l, err)
	}
	if conffiles, err := exec.Command("dpkg-query", "-W", "-f=${Conffiles}", "crisp").Output(); err != nil || !strings.Contains(string(conffiles), packageConffile) {
		t.Errorf("conffiles: %q (%v), want %s", conffiles, err, packageConffile)
	}

	t.Run("SystemdAnalyzeVerify", func(t *testing.T) {
		verifyUnit(t, "/lib/systemd/system/crisp.service")
	})

	t.Run("ServeFromInstalledFiles", func(t *testing.T) {
		serveInstalled(t)
	})

	if out, err := exec.Command("dpkg", "-r", "crisp").CombinedOutput(); err != nil {
		t.Fatalf("dpkg -r: %v\n%s", err, out)
	}
	for _, p := range packageFiles {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s left after dpkg -r", p)
		}
	}
	// A removed package keeps its conffiles (an operator's edits survive a reinstall).
	if _, err := os.Stat(packageConffile); err != nil {
		t.Errorf("conffile gone after dpkg -r (only purge removes it): %v", err)
	}
	if out, err := exec.Command("dpkg", "--purge", "crisp").CombinedOutput(); err != nil {
		t.Fatalf("dpkg --purge: %v\n%s", err, out)
	}
	for _, p := range []string{packageConffile, filepath.Dir(packageConffile), "/usr/share/doc/crisp"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s left after dpkg --purge", p)
		}
	}
	if left := systemdLeftovers(); len(left) > 0 {
		t.Errorf("systemd state left after purge: %v", left)
	}
	if exec.Command("dpkg", "-s", "crisp").Run() == nil {
		t.Error("dpkg still knows crisp after purge")
	}
}

// verifyUnit runs systemd-analyze verify on a unit whose binaries exist. It works
// without systemd as PID 1 (it only loads units), but exits 0 on unknown keys and bad
// values, which it only prints: any output is a failure too.
func verifyUnit(t *testing.T, unit string) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not found (Debian package systemd)")
	}
	out, err := exec.Command("systemd-analyze", "verify", "--man=no", unit).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// serveInstalled starts /usr/bin/criserver with /etc/crisp/config.toml, only the
// socket, the dirs and the network moved to the test's own, and runs a pod: the shim
// must be the installed one, found next to the installed criserver.
func serveInstalled(t *testing.T) {
	e := newEnv(t)
	cfg, err := config.Load(packageConffile)
	if err != nil {
		t.Fatalf("the installed config does not load: %v", err)
	}
	if cfg.Runtimes["runc"].Shim != "shim-runc" || !containsAll(strings.Join(cfg.CNI.BinDirs, ":"), "/usr/lib/cni") {
		t.Errorf("installed config: shim %q, CNI bin dirs %v", cfg.Runtimes["runc"].Shim, cfg.CNI.BinDirs)
	}
	if w, ok := cfg.Runtimes["wasm"]; !ok || w.Shim != "shim-wasm" || w.WarmSpare {
		t.Errorf("installed config: runtime wasm %+v (configured: %v), want shim-wasm without a warm spare", w, ok)
	}
	cfg.Socket, cfg.RootDir, cfg.StateDir = e.socket, e.root, e.state
	cfg.CNI.ConfDir, cfg.CNI.DefaultBridge, cfg.CNI.DefaultSubnet = filepath.Join(e.dir, "net.d"), e.bridge, e.subnet
	data, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.cfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}

	// The preflight from the installed files finds the installed shim.
	check, _ := exec.Command("/usr/bin/criserver", "--config", e.cfgPath, "check").Output()
	if !hasCheckLine(string(check), "ok", "runtime.runc.shim", "/usr/bin/shim-runc") {
		t.Errorf("criserver check does not find the installed shim:\n%s", check)
	}
	if !hasCheckLine(string(check), "ok", "runtime.wasm.shim", "/usr/bin/shim-wasm") {
		t.Errorf("criserver check does not find the installed shim-wasm:\n%s", check)
	}

	logf, err := os.OpenFile(e.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("/usr/bin/criserver", "--config", e.cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.cmd = cmd
	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.conn, e.rt, e.img = conn, cri.NewRuntimeServiceClient(conn), cri.NewImageServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	v, err := e.rt.Version(ctx, &cri.VersionRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("installed criserver does not answer Version: %v\n%s", err, e.log())
	}
	if v.RuntimeName != version.Name || v.RuntimeVersion != version.Version {
		t.Errorf("Version: %s %s, want %s %s", v.RuntimeName, v.RuntimeVersion, version.Name, version.Version)
	}

	id := e.runPod(ctx, e.podConfig("pkg"))
	_, info := e.status(ctx, id)
	if exe, err := os.Readlink("/proc/" + strconv.Itoa(info.ShimPid) + "/exe"); err != nil || exe != "/usr/bin/shim-runc" {
		t.Errorf("the pod's shim runs %q (%v), want /usr/bin/shim-runc", exe, err)
	}
	if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Errorf("StopPodSandbox: %v", err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Errorf("RemovePodSandbox: %v", err)
	}
	// The wasm handler of the installed config runs the installed shim-wasm.
	resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: e.podConfig("pkg-wasm"), RuntimeHandler: wasmHandler})
	if err != nil {
		t.Fatalf("RunPodSandbox on %s: %v\n%s", wasmHandler, err, e.log())
	}
	_, info = e.status(ctx, resp.PodSandboxId)
	if exe, err := os.Readlink("/proc/" + strconv.Itoa(info.ShimPid) + "/exe"); err != nil || exe != "/usr/bin/shim-wasm" {
		t.Errorf("the wasm pod's shim runs %q (%v), want /usr/bin/shim-wasm", exe, err)
	}
	if err := stopRemovePod(ctx, e.rt, resp.PodSandboxId); err != nil {
		t.Error(err)
	}
	e.stop()
}

// hasCheckLine reports whether out has a line of the given status and name whose
// detail contains want.
func hasCheckLine(out, status, name, want string) bool {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == status && f[1] == name && strings.Contains(l, want) {
			return true
		}
	}
	return false
}

// TestE2EPackageUnitVerify checks contrib/systemd/crisp.service without installing
// anything: systemd-analyze verify also checks that ExecStart exists, so the copy it
// verifies runs the criserver `make build` links instead of /usr/bin/criserver.
func TestE2EPackageUnitVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not found (Debian package systemd)")
	}
	bins := buildBinaries(t)
	unit, err := os.ReadFile(filepath.Join(repoRoot(), "contrib/systemd/crisp.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nKillMode=process\n", "\nDelegate=yes\n", "\nRestart=always\n", "\nExecStart=/usr/bin/criserver --config /etc/crisp/config.toml\n"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("unit lacks %q", strings.TrimSpace(want))
		}
	}
	copyPath := filepath.Join(t.TempDir(), "crisp.service")
	unit = bytes.ReplaceAll(unit, []byte("/usr/bin/criserver"), []byte(filepath.Join(bins, "criserver")))
	if err := os.WriteFile(copyPath, unit, 0o644); err != nil {
		t.Fatal(err)
	}
	verifyUnit(t, copyPath)
	// verifyUnit must fail a broken unit: systemd-analyze exits 0 on an unknown key.
	broken := filepath.Join(t.TempDir(), "crisp.service")
	if err := os.WriteFile(broken, bytes.Replace(unit, []byte("\nKillMode="), []byte("\nKillMod="), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("systemd-analyze", "verify", "--man=no", broken).CombinedOutput(); len(bytes.TrimSpace(out)) == 0 {
		t.Error("systemd-analyze printed nothing for an unknown key: verifyUnit could not catch one")
	}
}
