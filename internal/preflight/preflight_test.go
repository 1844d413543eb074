package preflight

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/crisp-runtime/crisp/internal/config"
)

// fakeHost builds /proc and /sys trees from path -> content under a temp dir.
func fakeHost(t *testing.T, files map[string]string) Host {
	t.Helper()
	dir := t.TempDir()
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Host{
		ProcDir:           filepath.Join(dir, "proc"),
		SysDir:            filepath.Join(dir, "sys"),
		SystemdDir:        filepath.Join(dir, "run/systemd/system"),
		KubeletConfig:     filepath.Join(dir, "kubelet/config.yaml"),
		RecursiveReadOnly: func() bool { return true },
		IDMappedMounts:    func(string) error { return nil },
		ResolveShim:       func(name string) (string, error) { return "/usr/bin/" + name, nil },
		NATChain:          func(bool, string) (string, error) { return "", errors.New("no chain by that name") },
	}
}

func TestOverlay(t *testing.T) {
	for _, tc := range []struct {
		name, filesystems string
		want              Status
	}{
		{"listed", "nodev\tsysfs\nnodev\toverlay\n\text4\n", OK},
		{"absent", "nodev\tsysfs\n\text4\n", Fail},
		{"overlay only as a prefix", "nodev\toverlayfoo\n", Fail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := fakeHost(t, map[string]string{"proc/filesystems": tc.filesystems})
			if r := checkOverlay(h); r.Status != tc.want {
				t.Errorf("got %v (%s), want %v", r.Status, r.Detail, tc.want)
			}
		})
	}
	if r := checkOverlay(fakeHost(t, nil)); r.Status != Fail {
		t.Errorf("unreadable /proc/filesystems: got %v, want FAIL", r.Status)
	}
}

func TestUserNS(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  Status
	}{
		{"enabled", map[string]string{"proc/sys/user/max_user_namespaces": "63432\n"}, OK},
		{"zero", map[string]string{"proc/sys/user/max_user_namespaces": "0\n"}, Warn},
		{"no such kernel feature", nil, Warn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r := checkUserNS(fakeHost(t, tc.files)); r.Status != tc.want {
				t.Errorf("got %v (%s), want %v", r.Status, r.Detail, tc.want)
			}
		})
	}
}

func TestKernelProbes(t *testing.T) {
	h := fakeHost(t, nil)
	var probed string
	h.IDMappedMounts = func(dir string) error { probed = dir; return errors.New("EINVAL") }
	h.RecursiveReadOnly = func() bool { return false }
	root := t.TempDir()
	// root_dir does not exist yet on a fresh node: its nearest existing ancestor is probed.
	if r := checkIDMapped(h, filepath.Join(root, "var/lib/crisp")); r.Status != Warn || probed != root {
		t.Errorf("idmapped: got %v (%s) probing %q, want warn probing %q", r.Status, r.Detail, probed, root)
	}
	if r := checkMountSetattr(h); r.Status != Warn {
		t.Errorf("mount_setattr: got %v, want warn", r.Status)
	}
	h = fakeHost(t, nil)
	if r := checkIDMapped(h, root); r.Status != OK {
		t.Errorf("idmapped: got %v, want ok", r.Status)
	}
	if r := checkMountSetattr(h); r.Status != OK {
		t.Errorf("mount_setattr: got %v, want ok", r.Status)
	}
}

const (
	mountinfoV2 = `25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
`
	mountinfoHybrid = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	procCgroups = `#subsys_name	hierarchy	num_cgroups	enabled
cpuset	3	1	1
cpu	1	1	1
cpuacct	2	1	1
memory	4	1046	1
devices	5	1	1
freezer	6	1	1
pids	8	1	1
`
)

func TestCgroups(t *testing.T) {
	for _, tc := range []struct {
		name              string
		files             map[string]string
		version           string
		wantVer, wantCtrl Status
		missing           string
	}{
		{"v2 complete", map[string]string{"proc/self/mountinfo": mountinfoV2, "sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n"}, "v2", OK, OK, ""},
		{"v2 without memory", map[string]string{"proc/self/mountinfo": mountinfoV2, "sys/fs/cgroup/cgroup.controllers": "cpuset cpu io pids\n"}, "v2", OK, Fail, "memory"},
		{"hybrid complete", map[string]string{"proc/self/mountinfo": mountinfoHybrid, "proc/cgroups": procCgroups}, "hybrid", OK, OK, ""},
		{"v1 memory disabled", map[string]string{"proc/self/mountinfo": mountinfoHybrid, "proc/cgroups": strings.Replace(procCgroups, "memory\t4\t1046\t1", "memory\t0\t1\t0", 1)}, "v1", OK, Fail, "memory"},
		{"v1 pids enabled but not mounted", map[string]string{"proc/self/mountinfo": strings.Replace(mountinfoHybrid, "rw,pids", "rw,net_cls", 1), "proc/cgroups": procCgroups}, "v1", OK, Fail, "pids"},
		{"no cgroups", map[string]string{"proc/self/mountinfo": "25 30 0:23 / /sys rw - sysfs sysfs rw\n"}, "no cgroup", Fail, Fail, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := checkCgroups(fakeHost(t, tc.files))
			if len(rs) != 2 {
				t.Fatalf("got %d results, want 2", len(rs))
			}
			if rs[0].Status != tc.wantVer || !strings.Contains(rs[0].Detail, tc.version) {
				t.Errorf("version: got %v %q, want %v containing %q", rs[0].Status, rs[0].Detail, tc.wantVer, tc.version)
			}
			if rs[1].Status != tc.wantCtrl || !strings.Contains(rs[1].Detail, tc.missing) {
				t.Errorf("controllers: got %v %q, want %v naming %q", rs[1].Status, rs[1].Detail, tc.wantCtrl, tc.missing)
			}
		})
	}
}

func TestCgroupDriver(t *testing.T) {
	for _, tc := range []struct {
		name    string
		driver  string
		kubelet string // "" means no kubelet config file
		systemd bool
		want    Status
	}{
		{"no kubelet config", "cgroupfs", "", false, OK},
		{"kubelet default is cgroupfs", "cgroupfs", "kind: KubeletConfiguration\n", false, OK},
		{"both systemd", "systemd", "kind: KubeletConfiguration\ncgroupDriver: systemd\n", true, OK},
		{"kubeadm's systemd vs cgroupfs", "cgroupfs", "kind: KubeletConfiguration\ncgroupDriver: systemd\n", true, Fail},
		{"systemd driver without systemd", "systemd", "cgroupDriver: systemd\n", false, Fail},
		{"unparsable kubelet config", "cgroupfs", "cgroupDriver: [\n", false, Warn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string]string{}
			if tc.kubelet != "" {
				files["kubelet/config.yaml"] = tc.kubelet
			}
			if tc.systemd {
				files["run/systemd/system/.keep"] = ""
			}
			if r := checkCgroupDriver(fakeHost(t, files), tc.driver); r.Status != tc.want {
				t.Errorf("got %v (%s), want %v", r.Status, r.Detail, tc.want)
			}
		})
	}
}

func TestCNI(t *testing.T) {
	const bridgeList = `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local"}},{"type":"portmap"}]}`
	for _, tc := range []struct {
		name        string
		confs       map[string]string
		plugins     []string
		wantConf    Status
		wantPlugins Status
		detail      string // in the plugins line
	}{
		{"empty dir: the default network's plugins", nil, []string{"bridge", "host-local", "portmap"}, OK, OK, "portmap"},
		{"empty dir without portmap", nil, []string{"bridge", "host-local"}, OK, Fail, "portmap"},
		{"conflist with its plugins", map[string]string{"10-n.conflist": bridgeList}, []string{"bridge", "host-local", "portmap"}, OK, OK, "host-local"},
		{"conflist missing its ipam", map[string]string{"10-n.conflist": bridgeList}, []string{"bridge", "portmap"}, OK, Fail, "host-local"},
		{"single .conf", map[string]string{"10-n.conf": `{"cniVersion":"0.4.0","name":"n","type":"macvlan","ipam":{"type":"dhcp"}}`}, []string{"macvlan", "dhcp"}, OK, OK, "dhcp"},
		{"broken first file skipped", map[string]string{"05-bad.conflist": "{", "10-n.conflist": bridgeList}, []string{"bridge", "host-local", "portmap"}, Warn, OK, ""},
		{"only broken files", map[string]string{"05-bad.conflist": "{"}, []string{"bridge", "host-local", "portmap"}, Fail, Fail, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf, bin := t.TempDir(), t.TempDir()
			for n, c := range tc.confs {
				if err := os.WriteFile(filepath.Join(conf, n), []byte(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range tc.plugins {
				if err := os.WriteFile(filepath.Join(bin, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			c := config.Default().CNI
			c.ConfDir, c.BinDirs = conf, []string{bin}
			rs := checkCNI(c)
			if rs[0].Status != tc.wantConf || rs[1].Status != tc.wantPlugins || !strings.Contains(rs[1].Detail, tc.detail) {
				t.Errorf("got %v %q / %v %q, want %v / %v naming %q", rs[0].Status, rs[0].Detail, rs[1].Status, rs[1].Detail, tc.wantConf, tc.wantPlugins, tc.detail)
			}
		})
	}
}

func TestMasquerade(t *testing.T) {
	rule := func(s string) string {
		return "-N CRISP-POSTROUTING\n-A CRISP-POSTROUTING -s " + s + " ! -d " + s +
			` -m addrtype ! --dst-type MULTICAST -m comment --comment "crisp-masquerade:0123abcd:` + s + `" -j MASQUERADE` + "\n"
	}
	dual := `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipMasq":true,
		"ipam":{"type":"host-local","ranges":[[{"subnet":"10.5.0.0/16"}],[{"subnet":"fd00:5::/64"}]]}}]}`
	dhcp := `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipMasq":true,"ipam":{"type":"dhcp"}}]}`
	for _, tc := range []struct {
		name   string
		mode   string
		conf   string // "" for none: criserver's default network
		v4, v6 string // what iptables and ip6tables list; "-" fails
		want   Status
		detail string
	}{
		{name: "plugin mode", mode: "plugin", conf: dual, v4: "-", v6: "-", want: OK, detail: "bridge plugin masquerades per pod"},
		{name: "default network, rule present", mode: "runtime", v4: rule("10.88.0.0/16"), v6: "-", want: OK, detail: "masquerades 10.88.0.0/16"},
		{name: "default network, no chain yet", mode: "runtime", v4: "-", v6: "-", want: Warn, detail: "for 10.88.0.0/16 yet"},
		{name: "dual stack, both present", mode: "runtime", conf: dual, v4: rule("10.5.0.0/16"), v6: rule("fd00:5::/64"), want: OK, detail: "10.5.0.0/16, fd00:5::/64"},
		{name: "dual stack, IPv6 missing", mode: "runtime", conf: dual, v4: rule("10.5.0.0/16"), v6: "-N CRISP-POSTROUTING\n", want: Warn, detail: "for fd00:5::/64 yet"},
		{name: "another subnet's rule", mode: "runtime", conf: dual, v4: rule("10.6.0.0/16"), v6: rule("fd00:5::/64"), want: Warn, detail: "for 10.5.0.0/16 yet"},
		{name: "dhcp left to the plugin", mode: "runtime", conf: dhcp, v4: "-", v6: "-", want: OK, detail: `the plugin keeps it: plugin 0 (bridge): IPAM "dhcp"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := fakeHost(t, nil)
			h.NATChain = func(v6 bool, chain string) (string, error) {
				out := tc.v4
				if v6 {
					out = tc.v6
				}
				if chain != "CRISP-POSTROUTING" || out == "-" {
					return "", errors.New("iptables: No chain/target/match by that name")
				}
				return out, nil
			}
			c := config.Default().CNI
			c.ConfDir, c.Masquerade = t.TempDir(), tc.mode
			if tc.conf != "" {
				if err := os.WriteFile(filepath.Join(c.ConfDir, "10-n.conflist"), []byte(tc.conf), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r := checkMasquerade(h, c)
			if r.Status != tc.want || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("got %v %q, want %v naming %q", r.Status, r.Detail, tc.want, tc.detail)
			}
		})
	}
}

func TestShims(t *testing.T) {
	h := fakeHost(t, nil)
	h.ResolveShim = func(name string) (string, error) {
		if name == "shim-runc" {
			return "/usr/bin/shim-runc", nil
		}
		return "", errors.New("not found")
	}
	cfg := config.Default()
	cfg.Runtimes = map[string]config.Runtime{"runc": {Shim: "shim-runc"}, "kata": {Shim: "containerd-shim-kata-v2"}}
	rs := checkShims(h, cfg)
	if len(rs) != 2 || rs[0].Name != "runtime.kata.shim" || rs[0].Status != Fail || rs[1].Name != "runtime.runc.shim" || rs[1].Status != OK {
		t.Errorf("got %+v, want kata FAIL then runc ok", rs)
	}
}

// A task-only handler needs shim-runc as its pause and, for a runc shim, the runc its
// options name.
func TestTaskShims(t *testing.T) {
	h := fakeHost(t, nil)
	have := map[string]bool{"shim-runc": true, "containerd-shim-runc-v2": true, "containerd-shim-runsc-v1": true, "runc": true}
	h.ResolveShim = func(name string) (string, error) {
		if have[name] {
			return "/usr/bin/" + name, nil
		}
		return "", errors.New("not found")
	}
	cfg := config.Default()
	cfg.Runtimes = map[string]config.Runtime{
		"a-runc":   {Shim: "containerd-shim-runc-v2", SandboxMode: "task", Options: map[string]any{"BinaryName": "/opt/runc-missing"}},
		"b-plain":  {Shim: "containerd-shim-runc-v2", SandboxMode: "task"},
		"c-gvisor": {Shim: "containerd-shim-runsc-v1", SandboxMode: "task"},
	}
	var got []string
	for _, r := range checkShims(h, cfg) {
		got = append(got, fmt.Sprintf("%s=%v", r.Name, r.Status))
	}
	want := []string{
		"runtime.a-runc.shim=" + OK.String(), "runtime.a-runc.pause=" + OK.String(), "runtime.a-runc.runc=" + Fail.String(),
		"runtime.b-plain.shim=" + OK.String(), "runtime.b-plain.pause=" + OK.String(), "runtime.b-plain.runc=" + OK.String(),
		"runtime.c-gvisor.shim=" + OK.String(), "runtime.c-gvisor.pause=" + OK.String(),
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestSysctls(t *testing.T) {
	on := map[string]string{
		"proc/sys/net/ipv4/ip_forward":                 "1\n",
		"proc/sys/net/bridge/bridge-nf-call-iptables":  "1\n",
		"proc/sys/net/bridge/bridge-nf-call-ip6tables": "1\n",
	}
	for _, tc := range []struct {
		name   string
		change map[string]string // "" deletes
		want   []Status
	}{
		{"all set", nil, []Status{OK, OK, OK}},
		{"no forwarding", map[string]string{"proc/sys/net/ipv4/ip_forward": "0\n"}, []Status{Fail, OK, OK}},
		{"br_netfilter not loaded", map[string]string{"proc/sys/net/bridge/bridge-nf-call-iptables": "", "proc/sys/net/bridge/bridge-nf-call-ip6tables": ""}, []Status{OK, Fail, Warn}},
		{"ip6tables off only", map[string]string{"proc/sys/net/bridge/bridge-nf-call-ip6tables": "0\n"}, []Status{OK, OK, Warn}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string]string{}
			for k, v := range on {
				files[k] = v
			}
			for k, v := range tc.change {
				if v == "" {
					delete(files, k)
				} else {
					files[k] = v
				}
			}
			rs := checkSysctls(fakeHost(t, files))
			for i, r := range rs {
				if r.Status != tc.want[i] {
					t.Errorf("%s: got %v (%s), want %v", r.Name, r.Status, r.Detail, tc.want[i])
				}
			}
		})
	}
}

// TestRunWrite: one line per check, each starting with its status, and failed exactly
// when a line is FAIL.
func TestRunWrite(t *testing.T) {
	h := fakeHost(t, map[string]string{"proc/filesystems": "nodev\toverlay\n"})
	cfg := config.Default()
	cfg.CNI.ConfDir = t.TempDir()
	results := Run(cfg, h)
	var buf bytes.Buffer
	failed := Write(&buf, results)
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != len(results) {
		t.Fatalf("%d lines for %d results:\n%s", len(lines), len(results), buf.String())
	}
	sawFail := false
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != results[i].Status.String() || f[1] != results[i].Name {
			t.Errorf("line %q does not match %+v", l, results[i])
		}
		sawFail = sawFail || f[0] == "FAIL"
	}
	// The fake tree has no mountinfo and no sysctls: there must be failures.
	if !sawFail || failed != sawFail {
		t.Errorf("failed = %v, FAIL lines seen = %v", failed, sawFail)
	}
	if Write(io.Discard, []Result{{Name: "a", Status: OK}, {Name: "b", Status: Warn}}) {
		t.Error("warnings alone must not fail the check")
	}
}

type fakeAppArmor struct {
	loaded bool
	err    error
}

func (f fakeAppArmor) DefaultLoaded() (bool, error) { return f.loaded, f.err }

func TestAppArmor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		aa       AppArmor
		disabled bool
		want     Status
		detail   string
	}{
		{"host without", nil, false, OK, "not enabled on this host"},
		{"loaded", fakeAppArmor{loaded: true}, false, OK, "crisp-default is loaded"},
		{"loaded at start", fakeAppArmor{}, false, OK, "criserver loads crisp-default when it starts"},
		{"unreadable", fakeAppArmor{err: errors.New("permission denied")}, false, Warn, "permission denied"},
		{"disabled", fakeAppArmor{loaded: true}, true, Warn, "disable_apparmor is set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := fakeHost(t, nil)
			h.AppArmor = func() AppArmor { return tc.aa }
			r := checkAppArmor(h, tc.disabled)
			if r.Status != tc.want || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("%v %q, want %v containing %q", r.Status, r.Detail, tc.want, tc.detail)
			}
		})
	}
}

func TestSELinux(t *testing.T) {
	const proc, file = "system_u:system_r:container_t:s0:c1,c2", "system_u:object_r:container_file_t:s0:c1,c2"
	for _, tc := range []struct {
		name    string
		se      SELinux
		enabled bool
		want    Status
		detail  string
	}{
		{"host without", SELinux{}, true, OK, "not enabled on this host"},
		{"enforcing", SELinux{Mode: "enforcing", Process: proc, File: file}, true, OK, "enforcing; each pod gets its own MCS level: processes " + proc},
		{"permissive", SELinux{Mode: "permissive", Process: proc, File: file}, true, OK, "permissive;"},
		{"switched off", SELinux{Mode: "enforcing", Process: proc, File: file}, false, Warn, "enable_selinux is false"},
		{"no container contexts", SELinux{Mode: "enforcing"}, true, Warn, "names no container contexts"},
		{"module not loaded", SELinux{Mode: "enforcing", Process: proc, Invalid: errors.New("invalid argument")}, true, Warn, "rejects the container label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := fakeHost(t, nil)
			h.SELinux = func() SELinux { return tc.se }
			r := checkSELinux(h, tc.enabled)
			if r.Status != tc.want || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("%v %q, want %v containing %q", r.Status, r.Detail, tc.want, tc.detail)
			}
		})
	}
	// The real host: this one may or may not run SELinux; the check must not fail.
	if r := checkSELinux(Default(), true); r.Status == Fail {
		t.Errorf("host check failed: %q", r.Detail)
	}
}
