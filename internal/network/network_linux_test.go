package network

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/network/netns"
	"github.com/crisp-runtime/crisp/internal/testutil"
)

// env is one test's private CNI world: config, cache and IPAM dirs, a bridge and a
// subnet nobody else uses, and the pods made in it. Everything goes at cleanup.
type env struct {
	t        testing.TB
	dir      string
	confDir  string
	cacheDir string
	ipamDir  string
	nsDir    string
	bridge   string
	subnet   *net.IPNet
	m        *Manager
	// masq and chain are the runtime masquerade setting and the test's own nat chain.
	masq  Masquerade
	chain string
}

type envOpt func(*env)

// withMasquerade sets who masquerades (default: the Manager's default, runtime).
func withMasquerade(mode Masquerade) envOpt {
	return func(e *env) { e.masq = mode }
}

// withConf writes the conflist returned by f (given the env's bridge, subnet and
// IPAM dir) instead of letting New write the default.
func withConf(f func(e *env) string) envOpt {
	return func(e *env) { writeFiles(e.t, e.confDir, map[string]string{"10-test.conflist": f(e)}) }
}

func newEnv(t testing.TB, opts ...envOpt) *env {
	t.Helper()
	testutil.RequiresRoot(t, "creates network namespaces, bridges and iptables rules")
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Skip("needs Debian's containernetworking-plugins in /usr/lib/cni")
	}
	dir := t.TempDir()
	e := &env{
		t:        t,
		dir:      dir,
		confDir:  filepath.Join(dir, "net.d"),
		cacheDir: filepath.Join(dir, "cache"),
		ipamDir:  filepath.Join(dir, "ipam"),
		nsDir:    filepath.Join(dir, "netns"),
		bridge:   "crt" + randHex(t, 2),
		subnet:   freeSubnet(t),
	}
	e.chain = "CRT-MASQ-" + strings.ToUpper(randHex(t, 3))
	t.Cleanup(e.cleanup)
	for _, o := range opts {
		o(e)
	}
	m, err := New(Config{
		ConfDir: e.confDir, CacheDir: e.cacheDir, IPAMDataDir: e.ipamDir,
		DefaultBridge: e.bridge, DefaultSubnet: e.subnet.String(),
		Masquerade: e.masq, MasqueradeChain: e.chain,
	}, testLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.m = m
	return e
}

// newManager is a second Manager on the env's dirs and chain, as after a restart.
func (e *env) newManager(mode Masquerade) *Manager {
	e.t.Helper()
	m, err := New(Config{
		ConfDir: e.confDir, CacheDir: e.cacheDir, IPAMDataDir: e.ipamDir,
		DefaultBridge: e.bridge, DefaultSubnet: e.subnet.String(),
		Masquerade: mode, MasqueradeChain: e.chain,
	}, testLogger(e.t))
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	return m
}

func (e *env) cleanup() {
	if l, err := netlink.LinkByName(e.bridge); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			e.t.Errorf("delete bridge %s: %v", e.bridge, err)
		}
	}
	// netns.New made the pin dir a bind mount of itself.
	for unix.Unmount(e.nsDir, unix.MNT_DETACH) == nil {
	}
	// The runtime masquerade's chain outlives a Manager on purpose; the test's goes.
	for _, f := range masqFamilies(e.chain) {
		if f.chainExists() {
			if err := f.remove(context.Background()); err != nil {
				e.t.Errorf("remove chain %s: %v", e.chain, err)
			}
		}
	}
	if e.m != nil {
		e.m.Close()
	}
}

// pod makes a pod with its own pinned namespace, torn down and removed at cleanup
// (and its NAT rules with it, should a failing test have left any).
func (e *env) pod(name string, pms ...PortMapping) Pod {
	e.t.Helper()
	id := "crt-" + randHex(e.t, 6) + "-" + name
	path, err := netns.New(e.nsDir, id)
	if err != nil {
		e.t.Fatalf("netns.New: %v", err)
	}
	p := Pod{ID: id, NetNS: path, Name: name, Namespace: "crisp-test", UID: "uid-" + id, PortMappings: pms}
	e.t.Cleanup(func() {
		if err := e.m.Teardown(context.Background(), p); err != nil {
			e.t.Errorf("cleanup Teardown: %v", err)
		}
		if err := netns.Remove(path); err != nil {
			e.t.Errorf("cleanup netns.Remove: %v", err)
		}
		removeNATLeftovers(e.t, id)
	})
	return p
}

func (e *env) setup(p Pod) *Result {
	e.t.Helper()
	res, err := e.m.Setup(context.Background(), p)
	if err != nil {
		e.t.Fatalf("Setup %s: %v", p.Name, err)
	}
	return res
}

func (e *env) teardown(p Pod) {
	e.t.Helper()
	if err := e.m.Teardown(context.Background(), p); err != nil {
		e.t.Fatalf("Teardown %s: %v", p.Name, err)
	}
}

// assertReleased checks that nothing of p's attachment is left on the host.
func (e *env) assertReleased(p Pod, ip net.IP) {
	e.t.Helper()
	if _, err := os.Stat(filepath.Join(e.ipamDir, DefaultNetworkName, ip.String())); !errors.Is(err, fs.ErrNotExist) {
		e.t.Errorf("IPAM reservation for %s still there (%v)", ip, err)
	}
	if rules := natRules(e.t, p.ID); len(rules) > 0 {
		e.t.Errorf("NAT rules of %s left:\n%s", p.Name, strings.Join(rules, "\n"))
	}
	if matches, _ := filepath.Glob(filepath.Join(e.cacheDir, "results", "*-"+p.ID+"-*")); len(matches) > 0 {
		e.t.Errorf("CNI result cache left: %v", matches)
	}
}

// bridgePorts counts the veths attached to the env's bridge.
func (e *env) bridgePorts() int {
	e.t.Helper()
	br, err := netlink.LinkByName(e.bridge)
	if err != nil {
		e.t.Fatalf("bridge %s: %v", e.bridge, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		e.t.Fatal(err)
	}
	n := 0
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			n++
		}
	}
	return n
}

func TestSetupTeardown(t *testing.T) {
	e := newEnv(t)
	a, b := e.pod("a"), e.pod("b")
	ra, rb := e.setup(a), e.setup(b)

	gw := nthIP(e.subnet, 1)
	for _, r := range []*Result{ra, rb} {
		if !e.subnet.Contains(r.IP) || r.IP.To4() == nil {
			t.Errorf("pod IP %v not an IPv4 address in %v", r.IP, e.subnet)
		}
		if r.Interface != "eth0" || !r.Gateway.Equal(gw) || len(r.AdditionalIPs) != 0 {
			t.Errorf("result = %+v, want eth0 via %v", r, gw)
		}
	}
	if ra.IP.Equal(rb.IP) {
		t.Fatalf("both pods got %v", ra.IP)
	}
	for _, c := range []struct {
		p Pod
		r *Result
	}{{a, ra}, {b, rb}} {
		checkPodNetNS(t, c.p.NetNS, c.r.IP, e.subnet, gw)
	}
	if n := e.bridgePorts(); n != 2 {
		t.Errorf("%d veths on the bridge, want 2", n)
	}

	// The host reaches a pod, and pods reach each other, over real TCP.
	addrA := serveInNetNS(t, a.NetNS, ra.IP, 8080)
	if got := dial(t, addrA); got != "hello from "+a.NetNS {
		t.Errorf("host -> pod a: got %q", got)
	}
	var fromB string
	if err := inNetNS(b.NetNS, func() error {
		var err error
		fromB, err = dialErr(addrA)
		return err
	}); err != nil {
		t.Fatalf("pod b -> pod a: %v", err)
	}
	if fromB != "hello from "+a.NetNS {
		t.Errorf("pod b -> pod a: got %q", fromB)
	}

	e.teardown(a)
	e.assertReleased(a, ra.IP)
	if n := e.bridgePorts(); n != 1 {
		t.Errorf("%d veths on the bridge after one teardown, want 1", n)
	}
	if hasLink(t, a.NetNS, "eth0") {
		t.Error("eth0 still in pod a's namespace after Teardown")
	}
	e.teardown(a) // twice is fine
	if err := netns.Remove(a.NetNS); err != nil {
		t.Fatal(err)
	}
	e.teardown(a) // and after the namespace is gone

	e.teardown(b)
	e.assertReleased(b, rb.IP)
	if n := e.bridgePorts(); n != 0 {
		t.Errorf("%d veths on the bridge after both teardowns, want 0", n)
	}
}

// TestTeardownWithoutNetNS: the namespace is removed before Teardown. The IP must
// still be released, and the bridge's masquerade rules removed too (the plugin alone
// would leave them; see standin.go). The plugin masquerades here: with the runtime
// masquerade it has no per-pod rules to leave.
func TestTeardownWithoutNetNS(t *testing.T) {
	e := newEnv(t, withMasquerade(MasqueradePlugin))
	p := e.pod("gone")
	r := e.setup(p)
	if len(natRules(t, p.ID)) == 0 {
		t.Fatal("no masquerade rules after Setup: the test would prove nothing")
	}
	if err := netns.Remove(p.NetNS); err != nil {
		t.Fatal(err)
	}
	e.teardown(p)
	e.assertReleased(p, r.IP)
	e.teardown(p)
	// The kernel destroys an unpinned namespace, and the veth with it, asynchronously.
	deadline := time.Now().Add(5 * time.Second)
	for e.bridgePorts() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := e.bridgePorts(); n != 0 {
		t.Errorf("%d veths left on the bridge", n)
	}
}

// TestTeardownWithoutCache: the libcni cache is lost; DEL with the current config
// still frees everything while the namespace exists.
func TestTeardownWithoutCache(t *testing.T) {
	e := newEnv(t)
	p := e.pod("nocache")
	r := e.setup(p)
	if err := os.RemoveAll(filepath.Join(e.cacheDir, "results")); err != nil {
		t.Fatal(err)
	}
	e.teardown(p)
	e.assertReleased(p, r.IP)
	if n := e.bridgePorts(); n != 0 {
		t.Errorf("%d veths left on the bridge", n)
	}
	e.teardown(p)
}

func TestPortMapping(t *testing.T) {
	e := newEnv(t)
	hostPort := int32(20000 + mrand.IntN(20000))
	p := e.pod("pm", PortMapping{HostPort: hostPort, ContainerPort: 8080, Protocol: "TCP"})
	r := e.setup(p)

	// portmap: a jump from CNI-HOSTPORT-DNAT tagged with the pod's ID, to a chain
	// that DNATs the host port to the pod.
	var dnChain string
	for _, rule := range natRules(t, p.ID) {
		if strings.HasPrefix(rule, "-A CNI-HOSTPORT-DNAT ") && strings.Contains(rule, fmt.Sprintf("--dports %d ", hostPort)) {
			dnChain = jumpTarget(rule)
		}
	}
	if dnChain == "" {
		t.Fatalf("no portmap jump for port %d in:\n%s", hostPort, strings.Join(natRules(t, p.ID), "\n"))
	}
	want := fmt.Sprintf("--dport %d -j DNAT --to-destination %s:8080", hostPort, r.IP)
	if !strings.Contains(strings.Join(chainRules(t, dnChain), "\n"), want) {
		t.Fatalf("chain %s has no %q:\n%s", dnChain, want, strings.Join(chainRules(t, dnChain), "\n"))
	}

	// And it forwards for real: the host's own address, port hostPort, reaches the pod.
	serveInNetNS(t, p.NetNS, r.IP, 8080)
	hostIP := hostAddr(t)
	if got := dial(t, net.JoinHostPort(hostIP.String(), fmt.Sprint(hostPort))); got != "hello from "+p.NetNS {
		t.Errorf("via host port: got %q", got)
	}

	// Teardown gets the mappings from the cache even if the caller forgot them.
	bare := p
	bare.PortMappings = nil
	e.teardown(bare)
	e.assertReleased(p, r.IP)
	if rules := chainRules(t, dnChain); rules != nil {
		t.Errorf("chain %s still exists after Teardown: %v", dnChain, rules)
	}
}

// TestSetupFailureCleansUp: a later plugin fails, so what the bridge plugin did
// (IP, veth, NAT rules) must be undone before Setup returns.
func TestSetupFailureCleansUp(t *testing.T) {
	e := newEnv(t, withConf(func(e *env) string {
		return fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"plugins":[
			{"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":true,
			 "ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}},
			{"type":"crisp-test-missing-plugin"}]}`, DefaultNetworkName, e.bridge, e.subnet, e.ipamDir)
	}))
	p := e.pod("fail")
	_, err := e.m.Setup(context.Background(), p)
	if err == nil {
		t.Fatal("Setup succeeded with a missing plugin")
	}
	for _, w := range []string{p.ID, "crisp-test/fail", "crisp-test-missing-plugin"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(e.ipamDir, DefaultNetworkName))
	for _, en := range entries {
		if net.ParseIP(en.Name()) != nil {
			t.Errorf("IPAM reservation %s left after failed Setup", en.Name())
		}
	}
	if rules := natRules(t, p.ID); len(rules) > 0 {
		t.Errorf("NAT rules left after failed Setup:\n%s", strings.Join(rules, "\n"))
	}
	if n := e.bridgePorts(); n != 0 {
		t.Errorf("%d veths left on the bridge after failed Setup", n)
	}
	if hasLink(t, p.NetNS, "eth0") {
		t.Error("eth0 left in the namespace after failed Setup")
	}
	if err := e.m.Ready(); err == nil || !strings.Contains(err.Error(), "crisp-test-missing-plugin") {
		t.Errorf("Ready = %v, want it to name the missing plugin", err)
	}
}

// TestLatency logs what RunPodSandbox and StopPodSandbox pay for networking.
func TestLatency(t *testing.T) {
	e := newEnv(t)
	for i := range 6 {
		start := time.Now()
		path, err := netns.New(e.nsDir, fmt.Sprintf("lat-%s-%d", randHex(t, 4), i))
		if err != nil {
			t.Fatal(err)
		}
		tNew := time.Since(start)
		p := Pod{ID: filepath.Base(path), NetNS: path, Name: "lat", Namespace: "crisp-test"}
		if i%2 == 1 {
			p.PortMappings = []PortMapping{{HostPort: int32(20000 + mrand.IntN(20000)), ContainerPort: 80, Protocol: "tcp"}}
		}
		start = time.Now()
		if _, err := e.m.Setup(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		tSetup := time.Since(start)
		start = time.Now()
		if err := e.m.Teardown(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		if err := netns.Remove(path); err != nil {
			t.Fatal(err)
		}
		t.Logf("netns.New %6.2fms  Setup %6.2fms  Teardown+Remove %6.2fms  (%d port mappings)",
			ms(tNew), ms(tSetup), ms(time.Since(start)), len(p.PortMappings))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// checkPodNetNS looks inside the pod's namespace: lo up, eth0 up with ip, a default
// route via gw.
func checkPodNetNS(t *testing.T, path string, ip net.IP, subnet *net.IPNet, gw net.IP) {
	t.Helper()
	h, err := vns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("lo not up in %s (%v)", path, err)
	}
	eth0, err := nh.LinkByName("eth0")
	if err != nil {
		t.Fatalf("no eth0 in %s: %v", path, err)
	}
	if eth0.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("eth0 down in %s", path)
	}
	addrs, err := nh.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range addrs {
		ones, _ := a.Mask.Size()
		wantOnes, _ := subnet.Mask.Size()
		found = found || (a.IP.Equal(ip) && ones == wantOnes)
	}
	if !found {
		t.Errorf("eth0 in %s has %v, want %v/%d", path, addrs, ip, maskLen(subnet))
	}
	routes, err := nh.RouteList(eth0, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	found = false
	for _, r := range routes {
		isDefault := r.Dst == nil || r.Dst.String() == "0.0.0.0/0"
		found = found || (isDefault && r.Gw.Equal(gw))
	}
	if !found {
		t.Errorf("no default route via %v in %s: %v", gw, path, routes)
	}
}

func maskLen(n *net.IPNet) int { ones, _ := n.Mask.Size(); return ones }

func hasLink(t *testing.T, path, name string) bool {
	t.Helper()
	h, err := vns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	_, err = nh.LinkByName(name)
	return err == nil
}

// inNetNS runs fn on a thread inside the namespace at path. The thread goes back
// afterwards (Go parks rather than ends a locked main thread, which would pin the
// namespace) and is never unlocked, so it is not reused if that failed.
func inNetNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		h, err := vns.GetFromPath(path)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := vns.Set(h); err != nil {
			errc <- err
			return
		}
		defer func() { _ = vns.Set(orig) }()
		errc <- fn()
	}()
	return <-errc
}

// serveInNetNS listens on ip:port inside the namespace (a socket stays in the
// namespace it was created in) and answers every connection with a greeting.
func serveInNetNS(t *testing.T, path string, ip net.IP, port int) string {
	t.Helper()
	addr := net.JoinHostPort(ip.String(), fmt.Sprint(port))
	var ln net.Listener
	if err := inNetNS(path, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", path, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "hello from %s\n", path)
			c.Close()
		}
	}()
	return addr
}

func dial(t *testing.T, addr string) string {
	t.Helper()
	s, err := dialErr(addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	return s
}

func dialErr(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	s, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	return strings.TrimSpace(s), nil
}

// hostAddr is a non-loopback IPv4 address of the host, for DNAT from the host itself.
func hostAddr(t *testing.T) net.IP {
	t.Helper()
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() && !a.IP.IsLinkLocalUnicast() && !strings.HasPrefix(a.IP.String(), "10.222.") {
			return a.IP
		}
	}
	t.Skip("host has no non-loopback IPv4 address")
	return nil
}

// freeSubnet picks a 10.222.n.0/24 that no route on the host overlaps.
func freeSubnet(t testing.TB) *net.IPNet {
	t.Helper()
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		_, cand, _ := net.ParseCIDR(fmt.Sprintf("10.222.%d.0/24", mrand.IntN(250)+1))
		clash := false
		for _, r := range routes {
			if r.Dst != nil && (r.Dst.Contains(cand.IP) || cand.Contains(r.Dst.IP)) && maskLen(r.Dst) > 0 {
				clash = true
			}
		}
		if !clash {
			return cand
		}
	}
	t.Fatal("no free 10.222.x.0/24")
	return nil
}

func nthIP(n *net.IPNet, i byte) net.IP {
	ip := make(net.IP, 4)
	copy(ip, n.IP.To4())
	ip[3] += i
	return ip
}

func randHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// natRules are the nat-table rules the plugins tagged with the pod's ID, plus the
// rules of the per-pod chains they jump to.
func natRules(t testing.TB, id string) []string {
	t.Helper()
	all := iptablesSave(t)
	tag := fmt.Sprintf(`id: \"%s\"`, id)
	var out []string
	chains := map[string]bool{}
	for _, l := range all {
		if strings.Contains(l, tag) {
			out = append(out, l)
			if c := jumpTarget(l); strings.HasPrefix(c, "CNI-") && !strings.HasPrefix(c, "CNI-HOSTPORT-") {
				chains[c] = true
			}
		}
	}
	for _, l := range all {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "-A" && chains[f[1]] && !strings.Contains(l, tag) {
			out = append(out, l)
		}
	}
	return out
}

// chainRules lists a nat chain's rules, nil if the chain does not exist.
func chainRules(t testing.TB, chain string) []string {
	t.Helper()
	out, err := exec.Command("iptables", "-t", "nat", "-S", chain).Output()
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

var jumpRE = regexp.MustCompile(` -j (\S+)`)

func jumpTarget(rule string) string {
	if m := jumpRE.FindStringSubmatch(rule); m != nil {
		return m[1]
	}
	return ""
}

func iptablesSave(t testing.TB) []string {
	t.Helper()
	out, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	return strings.Split(string(out), "\n")
}

// removeNATLeftovers deletes whatever per-pod nat rules and chains a failed test
// left. The shared CNI-HOSTPORT-* chains stay: other users of portmap on this host
// (other tests, a real runtime) depend on them.
func removeNATLeftovers(t testing.TB, id string) {
	rules := natRules(t, id)
	chains := map[string]bool{}
	for _, r := range rules {
		f := strings.Fields(r)
		if len(f) < 2 || f[0] != "-A" {
			continue
		}
		if c := jumpTarget(r); strings.HasPrefix(c, "CNI-") && !strings.HasPrefix(c, "CNI-HOSTPORT-") {
			chains[c] = true
		}
		// iptables-save quotes the way a shell does.
		_ = exec.Command("sh", "-c", "iptables -t nat -D "+strings.TrimPrefix(r, "-A ")).Run()
	}
	for c := range chains {
		_ = exec.Command("iptables", "-t", "nat", "-F", c).Run()
		_ = exec.Command("iptables", "-t", "nat", "-X", c).Run()
	}
}
