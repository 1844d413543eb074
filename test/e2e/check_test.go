package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// checkRun runs `criserver --config cfg check --kubelet-config kubelet` and returns
// its lines and exit code.
func checkRun(t *testing.T, bins, cfg, kubelet string) ([]string, int) {
	t.Helper()
	out, err := exec.Command(filepath.Join(bins, "criserver"), "--config", cfg, "check", "--kubelet-config", kubelet).Output()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("criserver check: %v", err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\n"), "\n"), code
}

// TestE2ECheck runs `criserver check` on this machine. What the machine lacks is not
// the test's business (br_netfilter may legitimately be missing); that the report is
// one well-formed line per check, with exit 1 exactly when a line is FAIL, is. Then a
// config with a missing shim and a kubelet with another cgroup driver must fail.
func TestE2ECheck(t *testing.T) {
	bins := buildBinaries(t)
	dir := t.TempDir()
	writeCfg := func(name, shim string) string {
		p := filepath.Join(dir, name)
		cfg := fmt.Sprintf("root_dir = %q\n[cni]\nconf_dir = %q\n[runtimes.runc]\nshim = %q\n", filepath.Join(dir, "root"), filepath.Join(dir, "net.d"), shim)
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := os.Mkdir(filepath.Join(dir, "net.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	good := writeCfg("good.toml", filepath.Join(bins, "shim-runc"))
	noKubelet := filepath.Join(dir, "no-kubelet.yaml")

	lines, code := checkRun(t, bins, good, noKubelet)
	names := map[string]string{}
	anyFail := false
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 3 {
			t.Errorf("malformed line %q", l)
			continue
		}
		switch f[0] {
		case "ok", "warn":
		case "FAIL":
			anyFail = true
		default:
			t.Errorf("line %q: status %q is not ok, warn or FAIL", l, f[0])
		}
		if _, dup := names[f[1]]; dup {
			t.Errorf("check %s reported twice", f[1])
		}
		names[f[1]] = f[0]
	}
	if want := map[bool]int{false: 0, true: 1}[anyFail]; code != want {
		t.Errorf("exit %d with FAIL lines = %v, want %d:\n%s", code, anyFail, want, strings.Join(lines, "\n"))
	}
	for _, n := range []string{"kernel.overlayfs", "kernel.user_namespaces", "kernel.idmapped_mounts", "kernel.mount_setattr", "cgroup.version", "cgroup.controllers", "cgroup.driver", "cni.config", "cni.plugins", "runtime.runc.shim", "net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables"} {
		if _, ok := names[n]; !ok {
			t.Errorf("no %s line:\n%s", n, strings.Join(lines, "\n"))
		}
	}
	if names["runtime.runc.shim"] != "ok" || names["cgroup.driver"] != "ok" {
		t.Errorf("the built shim or the absent kubelet config is not ok:\n%s", strings.Join(lines, "\n"))
	}
	if _, err := os.Stat(filepath.Join(dir, "net.d")); err == nil {
		if ents, _ := os.ReadDir(filepath.Join(dir, "net.d")); len(ents) > 0 {
			t.Errorf("check wrote into the CNI conf dir: %v", ents)
		}
	}

	for _, tc := range []struct {
		name, cfg, kubelet, failing string
	}{
		{"missing shim", writeCfg("bad.toml", "no-such-shim-for-crisp"), noKubelet, "runtime.runc.shim"},
		{"kubelet on systemd", good, "systemd", "cgroup.driver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kubelet := tc.kubelet
			if kubelet == "systemd" {
				kubelet = filepath.Join(dir, "kubelet.yaml")
				if err := os.WriteFile(kubelet, []byte("kind: KubeletConfiguration\ncgroupDriver: systemd\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			lines, code := checkRun(t, bins, tc.cfg, kubelet)
			if code != 1 || !hasCheckLine(strings.Join(lines, "\n"), "FAIL", tc.failing, "") {
				t.Errorf("exit %d, want 1 with %s FAIL:\n%s", code, tc.failing, strings.Join(lines, "\n"))
			}
		})
	}
}
