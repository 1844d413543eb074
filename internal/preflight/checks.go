package preflight

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"sigs.k8s.io/yaml"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/network"
)

// checkOverlay: image snapshots are overlay mounts, so every pod needs overlayfs.
func checkOverlay(h Host) Result {
	r := Result{Name: "kernel.overlayfs"}
	data, err := os.ReadFile(filepath.Join(h.ProcDir, "filesystems"))
	if err != nil {
		r.Status, r.Detail = Fail, fmt.Sprintf("cannot read the kernel's filesystems: %v", err)
		return r
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == "overlay" {
			r.Detail = "overlay filesystem available"
			return r
		}
	}
	r.Status, r.Detail = Fail, "overlay is not in /proc/filesystems: modprobe overlay (the systemd unit does it at start)"
	return r
}

// checkUserNS: pods with hostUsers: false run in a user namespace; others do not need one.
func checkUserNS(h Host) Result {
	r := Result{Name: "kernel.user_namespaces"}
	data, err := os.ReadFile(filepath.Join(h.ProcDir, "sys/user/max_user_namespaces"))
	if err != nil {
		r.Status, r.Detail = Warn, fmt.Sprintf("kernel without user namespaces (%v): pods with hostUsers: false are refused", err)
		return r
	}
	if v := strings.TrimSpace(string(data)); v == "0" {
		r.Status, r.Detail = Warn, "user.max_user_namespaces is 0: pods with hostUsers: false are refused"
		return r
	}
	r.Detail = "available"
	return r
}

// checkIDMapped runs criserver's own probe on the filesystem that will hold root_dir
// (the nearest existing ancestor on a fresh node).
func checkIDMapped(h Host, rootDir string) Result {
	r := Result{Name: "kernel.idmapped_mounts"}
	dir := existingAncestor(rootDir)
	if err := h.IDMappedMounts(dir); err != nil {
		r.Status, r.Detail = Warn, fmt.Sprintf("not on %s (%v): pods with hostUsers: false are refused", dir, err)
		return r
	}
	r.Detail = "idmapped mounts work on " + dir
	return r
}

func existingAncestor(p string) string {
	for p = filepath.Clean(p); p != "/"; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "/"
}

// checkMountSetattr: recursive read-only mounts (the OCI "rro" option) need mount_setattr.
func checkMountSetattr(h Host) Result {
	r := Result{Name: "kernel.mount_setattr"}
	if !h.RecursiveReadOnly() {
		r.Status, r.Detail = Warn, "no mount_setattr (Linux 5.12+): recursive read-only mounts are refused"
		return r
	}
	r.Detail = "available: recursive read-only mounts supported"
	return r
}

// Controllers kubelet's system validation requires (kubeadm's cgroup validator): on
// v2 the devices and freezer functions are built in, not controllers.
var (
	requiredV1 = []string{"cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids"}
	requiredV2 = []string{"cpu", "cpuset", "memory", "pids"}
)

// cgroupMount is one cgroup filesystem from mountinfo.
type cgroupMount struct {
	point, fstype string
	options       []string // super options: the v1 controllers
}

// checkCgroups reports the cgroup version and whether the controllers kubelet needs
// are there. Which version is what is mounted on /sys/fs/cgroup (read from mountinfo,
// so a fake tree can describe any host).
func checkCgroups(h Host) []Result {
	version := Result{Name: "cgroup.version"}
	ctrls := Result{Name: "cgroup.controllers"}
	mounts, err := cgroupMounts(filepath.Join(h.ProcDir, "self/mountinfo"))
	if err != nil {
		version.Status, version.Detail = Fail, err.Error()
		ctrls.Status, ctrls.Detail = Fail, "cgroups unknown"
		return []Result{version, ctrls}
	}
	var unified, v1 bool
	var hybrid bool
	for _, m := range mounts {
		switch {
		case m.fstype == "cgroup2" && m.point == "/sys/fs/cgroup":
			unified = true
		case m.fstype == "cgroup2" && m.point == "/sys/fs/cgroup/unified":
			hybrid = true
		case m.fstype == "cgroup":
			v1 = true
		}
	}
	var have map[string]bool
	var required []string
	switch {
	case unified:
		version.Detail = "v2 (unified)"
		required = requiredV2
		have, err = v2Controllers(filepath.Join(h.SysDir, "fs/cgroup/cgroup.controllers"))
	case v1:
		version.Detail = "v1"
		if hybrid {
			version.Detail = "v1 (hybrid: v2 also mounted on /sys/fs/cgroup/unified)"
		}
		required = requiredV1
		have, err = v1Controllers(filepath.Join(h.ProcDir, "cgroups"), mounts)
	default:
		version.Status, version.Detail = Fail, "no cgroup filesystem mounted on /sys/fs/cgroup"
		ctrls.Status, ctrls.Detail = Fail, "cgroups unknown"
		return []Result{version, ctrls}
	}
	if err != nil {
		ctrls.Status, ctrls.Detail = Fail, err.Error()
		return []Result{version, ctrls}
	}
	var missing []string
	for _, c := range required {
		if !have[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		ctrls.Status, ctrls.Detail = Fail, "missing (kubelet needs them): "+strings.Join(missing, ", ")
	} else {
		ctrls.Detail = strings.Join(required, ", ")
	}
	return []Result{version, ctrls}
}

// cgroupMounts lists the cgroup and cgroup2 mounts of a mountinfo file.
func cgroupMounts(path string) ([]cgroupMount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	var out []cgroupMount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, af := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(af) < 3 || (af[0] != "cgroup" && af[0] != "cgroup2") {
			continue
		}
		out = append(out, cgroupMount{point: pf[4], fstype: af[0], options: strings.Split(af[2], ",")})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mounts %s: %w", path, err)
	}
	return out, nil
}

func v2Controllers(path string) (map[string]bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cgroup v2 controllers: %w", err)
	}
	have := map[string]bool{}
	for _, c := range strings.Fields(string(data)) {
		have[c] = true
	}
	return have, nil
}

// v1Controllers are the controllers the kernel enables (/proc/cgroups) that are also
// mounted: an enabled controller with no hierarchy is of no use to kubelet.
func v1Controllers(procCgroups string, mounts []cgroupMount) (map[string]bool, error) {
	data, err := os.ReadFile(procCgroups)
	if err != nil {
		return nil, fmt.Errorf("read cgroup v1 controllers: %w", err)
	}
	mounted := map[string]bool{}
	for _, m := range mounts {
		if m.fstype == "cgroup" {
			for _, o := range m.options {
				mounted[o] = true
			}
		}
	}
	have := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && !strings.HasPrefix(f[0], "#") && f[3] == "1" && mounted[f[0]] {
			have[f[0]] = true
		}
	}
	return have, nil
}

// checkCgroupDriver: kubelet and the runtime must agree on who manages pod cgroups;
// kubelet refuses to run pods when RuntimeConfig reports another driver.
func checkCgroupDriver(h Host, driver string) Result {
	r := Result{Name: "cgroup.driver"}
	if driver == config.CgroupDriverSystemd {
		if _, err := os.Stat(h.SystemdDir); err != nil {
			r.Status, r.Detail = Fail, "cgroup_driver is systemd but systemd is not running (no "+h.SystemdDir+"): use cgroupfs"
			return r
		}
	}
	data, err := os.ReadFile(h.KubeletConfig)
	if errors.Is(err, os.ErrNotExist) {
		r.Detail = fmt.Sprintf("%s; no kubelet config at %s: kubelet's cgroupDriver must be %s", driver, h.KubeletConfig, driver)
		return r
	}
	if err != nil {
		r.Status, r.Detail = Warn, fmt.Sprintf("%s; cannot read kubelet's config: %v", driver, err)
		return r
	}
	var kc struct {
		CgroupDriver string `json:"cgroupDriver"`
	}
	if err := yaml.Unmarshal(data, &kc); err != nil {
		r.Status, r.Detail = Warn, fmt.Sprintf("%s; cannot parse kubelet's config %s: %v", driver, h.KubeletConfig, err)
		return r
	}
	kubelet := kc.CgroupDriver
	if kubelet == "" {
		kubelet = config.CgroupDriverCgroupfs // kubelet's default
	}
	if kubelet != driver {
		r.Status, r.Detail = Fail, fmt.Sprintf("crisp uses %s but kubelet (%s) uses %s: set cgroup_driver = %q or kubelet's cgroupDriver", driver, h.KubeletConfig, kubelet, kubelet)
		return r
	}
	r.Detail = fmt.Sprintf("%s, as kubelet's (%s)", driver, h.KubeletConfig)
	return r
}

// defaultPlugins are the plugins of the bridge network criserver writes into an empty
// conf_dir (network.defaultConfList): bridge with host-local IPAM, then portmap.
var defaultPlugins = []string{"bridge", "host-local", "portmap"}

// checkCNI finds the config criserver will use (the lexically first usable one in
// conf_dir, broken ones skipped, read with package network's own ConfigFiles and
// LoadConfigFile) and every plugin it needs in bin_dirs. network.New cannot be used:
// it writes the default config and retries pending DELs, which a check must not do
// next to a running criserver.
func checkCNI(c config.CNIConfig) []Result {
	conf := Result{Name: "cni.config"}
	plugins := Result{Name: "cni.plugins"}
	files, err := network.ConfigFiles(c.ConfDir)
	if err != nil {
		conf.Status, conf.Detail = Fail, fmt.Sprintf("list %s: %v", c.ConfDir, err)
		plugins.Status, plugins.Detail = Fail, "no network config to check"
		return []Result{conf, plugins}
	}
	var types []string
	var skipped []string
	for _, f := range files {
		t, err := configTypes(f)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("%s: %v", filepath.Base(f), err))
			continue
		}
		types = t
		conf.Detail = f
		break
	}
	switch {
	case types == nil && len(skipped) > 0:
		conf.Status, conf.Detail = Fail, fmt.Sprintf("no usable config in %s (%s)", c.ConfDir, strings.Join(skipped, "; "))
		plugins.Status, plugins.Detail = Fail, "no network config to check"
		return []Result{conf, plugins}
	case types == nil:
		conf.Detail = fmt.Sprintf("none in %s: criserver writes its default bridge network %s (%s) there at start", c.ConfDir, c.DefaultBridge, c.DefaultSubnet)
		types = defaultPlugins
	case len(skipped) > 0:
		conf.Status = Warn
		conf.Detail += " (skipped broken: " + strings.Join(skipped, "; ") + ")"
	}
	var missing, found []string
	for _, t := range types {
		p, err := invoke.FindInPath(t, c.BinDirs)
		if err != nil {
			missing = append(missing, t)
			continue
		}
		found = append(found, p)
	}
	if len(missing) > 0 {
		plugins.Status, plugins.Detail = Fail, fmt.Sprintf("%s not found in %s (Debian: apt-get install containernetworking-plugins)", strings.Join(missing, ", "), strings.Join(c.BinDirs, ":"))
	} else {
		plugins.Detail = strings.Join(found, " ")
	}
	return []Result{conf, plugins}
}

// configTypes loads one CNI config file as package network does and returns its plugin
// and IPAM types.
func configTypes(path string) ([]string, error) {
	list, err := network.LoadConfigFile(path)
	if err != nil {
		return nil, err
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
		if t := p.Network.IPAM.Type; t != "" {
			types = append(types, t)
		}
	}
	return types, nil
}

// checkShims: a handler whose shim is missing fails every pod that names it.
func checkShims(h Host, cfg config.Config) []Result {
	var out []Result
	for _, name := range cfg.HandlerNames() {
		r := Result{Name: "runtime." + name + ".shim"}
		rt := cfg.Runtimes[name]
		p, err := h.ResolveShim(rt.Shim)
		if err != nil {
			r.Status, r.Detail = Fail, err.Error()
		} else {
			r.Detail = p
		}
		out = append(out, r)
		if rt.Mode() == config.SandboxModeTask {
			out = append(out, checkTaskShim(h, name, rt)...)
		}
	}
	return out
}

// checkTaskShim: a task-only shim's pods need crisp's shim-runc as their pause, and
// a runc shim the runc its options name (BinaryName, else runc on PATH).
func checkTaskShim(h Host, name string, rt config.Runtime) []Result {
	bins := [][2]string{{"pause", "shim-runc"}}
	if strings.Contains(filepath.Base(rt.Shim), "runc") {
		runc := "runc"
		for k, v := range rt.Options {
			if s, ok := v.(string); ok && strings.EqualFold(strings.ReplaceAll(k, "_", ""), "binaryname") && s != "" {
				runc = s
			}
		}
		bins = append(bins, [2]string{"runc", runc})
	}
	var out []Result
	for _, b := range bins {
		r := Result{Name: "runtime." + name + "." + b[0]}
		if p, err := h.ResolveShim(b[1]); err != nil {
			r.Status, r.Detail = Fail, err.Error()
		} else {
			r.Detail = p
		}
		out = append(out, r)
	}
	return out
}

// sysctl is one setting kubelet's networking relies on.
type sysctl struct {
	key      string // dotted name
	required bool
	missing  string // what it means when the file does not exist
}

// sysctls are what kubeadm's preflight requires: forwarding for pod traffic, and
// bridged traffic through iptables so Service rules (kube-proxy) apply to pods on the
// same bridge. The bridge keys exist only with br_netfilter loaded.
var sysctls = []sysctl{
	{key: "net.ipv4.ip_forward", required: true, missing: "no IPv4 forwarding"},
	{key: "net.bridge.bridge-nf-call-iptables", required: true, missing: "br_netfilter not loaded: modprobe br_netfilter (the systemd unit does it at start)"},
	{key: "net.bridge.bridge-nf-call-ip6tables", required: false, missing: "br_netfilter not loaded: modprobe br_netfilter (the systemd unit does it at start)"},
}

func checkSysctls(h Host) []Result {
	var out []Result
	for _, s := range sysctls {
		r := Result{Name: s.key}
		bad := Warn
		if s.required {
			bad = Fail
		}
		data, err := os.ReadFile(filepath.Join(h.ProcDir, "sys", strings.ReplaceAll(s.key, ".", "/")))
		switch v := strings.TrimSpace(string(data)); {
		case errors.Is(err, os.ErrNotExist):
			r.Status, r.Detail = bad, s.missing
		case err != nil:
			r.Status, r.Detail = bad, err.Error()
		case v != "1":
			r.Status, r.Detail = bad, fmt.Sprintf("is %s, must be 1: sysctl -w %s=1 (and in /etc/sysctl.d to keep it)", v, s.key)
		default:
			r.Detail = "1"
		}
		out = append(out, r)
	}
	return out
}

// checkMasquerade: with cni.masquerade = "runtime", pods of a bridge network with
// ipMasq reach the outside only through crisp's rule for their subnet. criserver
// installs it at start and before a pod of the subnet is set up; this reports whether
// it is there, and why crisp leaves a plugin's ipMasq alone.
func checkMasquerade(h Host, c config.CNIConfig) Result {
	r := Result{Name: "cni.masquerade"}
	if c.Masquerade != "runtime" {
		r.Detail = fmt.Sprintf("%s: the bridge plugin masquerades per pod", c.Masquerade)
		return r
	}
	var subnets []*net.IPNet
	var kept []string
	var err error
	files, _ := network.ConfigFiles(c.ConfDir)
	chosen := ""
	for _, f := range files {
		list, lerr := network.LoadConfigFile(f)
		if lerr != nil {
			continue
		}
		chosen = filepath.Base(f)
		subnets, kept, err = network.MasqueradeSubnets(list)
		break
	}
	if chosen == "" {
		chosen = "the default network"
		subnets, err = network.DefaultMasqueradeSubnets(c.DefaultSubnet)
	}
	if err != nil {
		r.Status, r.Detail = Warn, fmt.Sprintf("%s: %v", chosen, err)
		return r
	}
	if len(subnets) == 0 {
		r.Detail = fmt.Sprintf("%s has no bridge with ipMasq crisp takes over", chosen)
		if len(kept) > 0 {
			r.Detail += " (the plugin keeps it: " + strings.Join(kept, "; ") + ")"
		}
		return r
	}
	var have, missing []string
	for _, n := range subnets {
		out, err := h.NATChain(n.IP.To4() == nil, network.DefaultMasqueradeChain)
		if errors.Is(err, exec.ErrNotFound) {
			r.Status, r.Detail = Fail, fmt.Sprintf("%s: masquerading %s needs iptables (%v)", chosen, n, err)
			return r
		}
		s := n.String()
		if err == nil && strings.Contains(out, "-s "+s+" ! -d "+s+" ") && strings.Contains(out, "-j MASQUERADE") {
			have = append(have, s)
		} else {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		r.Status = Warn
		r.Detail = fmt.Sprintf("%s: no rule in nat chain %s for %s yet (criserver adds it at start and before the first pod)",
			chosen, network.DefaultMasqueradeChain, strings.Join(missing, ", "))
		return r
	}
	r.Detail = fmt.Sprintf("%s: nat chain %s masquerades %s", chosen, network.DefaultMasqueradeChain, strings.Join(have, ", "))
	return r
}

// listNATChain runs iptables (or ip6tables) -S for one chain of the nat table. It
// only reads.
func listNATChain(v6 bool, chain string) (string, error) {
	bin := "iptables"
	if v6 {
		bin = "ip6tables"
	}
	out, err := exec.Command(bin, "-w", "-t", "nat", "-S", chain).Output()
	if err != nil {
		return "", fmt.Errorf("%s -t nat -S %s: %w", bin, chain, err)
	}
	return string(out), nil
}

// checkAppArmor says whether containers will be confined: on a host with AppArmor,
// criserver loads crisp-default at start and gives it to containers that ask for
// nothing or RuntimeDefault (containerd's behaviour). A host without it is fine, as
// for containerd: containers then run unconfined and pods that ask for a profile are
// refused.
func checkAppArmor(h Host, disabled bool) Result {
	r := Result{Name: "security.apparmor"}
	var aa AppArmor
	if h.AppArmor != nil {
		aa = h.AppArmor()
	}
	switch {
	case aa == nil:
		r.Detail = "not enabled on this host: containers run without an AppArmor profile, and pods that ask for one are refused"
	case disabled:
		r.Status, r.Detail = Warn, "enabled on this host but disable_apparmor is set: containers run unconfined, and pods that ask for a profile are refused"
	default:
		loaded, err := aa.DefaultLoaded()
		switch {
		case err != nil:
			r.Status, r.Detail = Warn, fmt.Sprintf("enabled, but the loaded profiles cannot be read: %v", err)
		case loaded:
			r.Detail = "enabled; crisp-default is loaded and confines containers that ask for no profile or RuntimeDefault"
		default:
			r.Detail = "enabled; criserver loads crisp-default when it starts (apparmor_parser)"
		}
	}
	return r
}
