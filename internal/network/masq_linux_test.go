package network

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"

	"github.com/crisp-runtime/crisp/internal/network/netns"
)

// chainExists reports whether the family's chain is in its nat table.
func (f iptablesFamily) chainExists() bool {
	return exec.Command(f.bin, "-w", "-t", "nat", "-S", f.chain).Run() == nil
}

// masqRules lists the rules of the env's masquerade chain (IPv4).
func (e *env) masqRules() []string {
	e.t.Helper()
	var out []string
	for _, l := range chainRules(e.t, e.chain) {
		if strings.HasPrefix(l, "-A ") {
			out = append(out, l)
		}
	}
	return out
}

// assertMasqFor checks that the env's chain holds exactly one rule per subnet, and
// that POSTROUTING jumps to it once.
func (e *env) assertMasqFor(subnets ...*net.IPNet) {
	e.t.Helper()
	rules := e.masqRules()
	var got []string
	for _, r := range rules {
		m := ruleComment.FindStringSubmatch(r)
		if m != nil && m[1] != e.m.masq.owner {
			continue // another instance's
		}
		if m == nil || !strings.Contains(r, "-j MASQUERADE") || !strings.Contains(r, "-s "+m[2]+" ! -d "+m[2]) {
			e.t.Errorf("unexpected rule in %s: %s", e.chain, r)
			continue
		}
		got = append(got, m[2])
	}
	var want []string
	for _, n := range subnets {
		want = append(want, n.String())
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		e.t.Errorf("masquerade rules for %v, want %v:\n%s", got, want, strings.Join(rules, "\n"))
	}
	jumps := 0
	for _, l := range chainRules(e.t, "POSTROUTING") {
		if jumpTarget(l) == e.chain {
			jumps++
		}
	}
	if want, got := min(len(rules), 1), jumps; got != want {
		e.t.Errorf("%d jumps from POSTROUTING to %s, want %d", got, e.chain, want)
	}
}

// outside is a namespace standing for the world beyond the node: reachable from the
// host over a veth, with no route back to the pod subnet, so a pod's connection to it
// only works when the pod's address is masqueraded to the host's.
type outside struct {
	hostIP, ip net.IP
	port       int
}

func (e *env) outside() outside {
	e.t.Helper()
	var link *net.IPNet
	for link == nil || link.Contains(e.subnet.IP) {
		link = freeSubnet(e.t)
	}
	o := outside{hostIP: nthIP(link, 1), ip: nthIP(link, 2), port: 8081}
	path, err := netns.New(e.nsDir, "outside-"+randHex(e.t, 4))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if err := netns.Remove(path); err != nil {
			e.t.Errorf("remove outside netns: %v", err)
		}
	})
	hostName := "cro" + randHex(e.t, 3)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName}, PeerName: "cri" + randHex(e.t, 3)}
	if err := netlink.LinkAdd(veth); err != nil {
		e.t.Fatalf("create veth: %v", err)
	}
	e.t.Cleanup(func() {
		if l, err := netlink.LinkByName(hostName); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	peer, err := netlink.LinkByName(veth.PeerName)
	if err != nil {
		e.t.Fatal(err)
	}
	h, err := vns.GetFromPath(path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer h.Close()
	if err := netlink.LinkSetNsFd(peer, int(h)); err != nil {
		e.t.Fatal(err)
	}
	host, _ := netlink.LinkByName(hostName)
	mask := link.Mask
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: &net.IPNet{IP: o.hostIP, Mask: mask}}); err != nil {
		e.t.Fatal(err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		e.t.Fatal(err)
	}
	if err := inNetNS(path, func() error {
		l, err := netlink.LinkByName(veth.PeerName)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: o.ip, Mask: mask}}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	}); err != nil {
		e.t.Fatalf("set up outside netns: %v", err)
	}
	// The server answers with the address it sees the client come from.
	var ln net.Listener
	if err := inNetNS(path, func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(o.ip.String(), fmt.Sprint(o.port)))
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			fmt.Fprintf(c, "%s\n", host)
			c.Close()
		}
	}()
	return o
}

// reach connects from the pod's namespace to the outside server and returns the
// address the server saw.
func (o outside) reach(t *testing.T, p Pod) (string, error) {
	t.Helper()
	var got string
	err := inNetNS(p.NetNS, func() error {
		var err error
		got, err = dialErr(net.JoinHostPort(o.ip.String(), fmt.Sprint(o.port)))
		return err
	})
	return got, err
}

// TestRuntimeMasquerade: two pods of the default (ipMasq) network get no per-pod
// chain, one rule masquerades their subnet, and they reach an address outside it as
// the host. Teardown leaves nothing per pod and the rule stays.
func TestRuntimeMasquerade(t *testing.T) {
	e := newEnv(t)
	o := e.outside()
	a, b := e.pod("a"), e.pod("b")
	ra, rb := e.setup(a), e.setup(b)
	e.assertMasqFor(e.subnet)
	for _, c := range []struct {
		p Pod
		r *Result
	}{{a, ra}, {b, rb}} {
		if rules := natRules(t, c.p.ID); len(rules) > 0 {
			t.Errorf("per-pod NAT rules of %s with the runtime masquerade:\n%s", c.p.Name, strings.Join(rules, "\n"))
		}
		got, err := o.reach(t, c.p)
		if err != nil {
			t.Errorf("pod %s -> outside %s: %v", c.p.Name, o.ip, err)
		} else if got != o.hostIP.String() {
			t.Errorf("outside saw pod %s (%s) come from %s, want the host's %s", c.p.Name, c.r.IP, got, o.hostIP)
		}
	}
	// Without the rule the outside cannot answer: the check above proves the NAT. A
	// forced sync (a restart, a new config) puts the rule back.
	if _, err := masqFamilies(e.chain)[0].run(context.Background(), "-F", e.chain); err != nil {
		t.Fatal(err)
	}
	if got, err := o.reach(t, a); err == nil {
		t.Errorf("pod a reached the outside (as %s) without the masquerade rule", got)
	}
	if err := e.m.syncMasq(context.Background(), e.m.masqSubnets()); err != nil {
		t.Fatal(err)
	}
	e.assertMasqFor(e.subnet)
	if got, err := o.reach(t, a); err != nil || got != o.hostIP.String() {
		t.Errorf("pod a -> outside after resync: saw %q, %v", got, err)
	}
	// The pods still reach each other unmasqueraded.
	addrA := serveInNetNS(t, a.NetNS, ra.IP, 8080)
	if err := inNetNS(b.NetNS, func() error {
		got, err := dialErr(addrA)
		if err == nil && got != "hello from "+a.NetNS {
			err = fmt.Errorf("got %q", got)
		}
		return err
	}); err != nil {
		t.Errorf("pod b -> pod a: %v", err)
	}
	e.teardown(a)
	e.teardown(b)
	e.assertReleased(a, ra.IP)
	e.assertReleased(b, rb.IP)
	e.assertMasqFor(e.subnet)
	if err := e.m.syncMasq(context.Background(), e.m.masqSubnets()); err != nil {
		t.Fatal(err)
	}
	e.assertMasqFor(e.subnet)
	// Stopped without pods, crisp leaves no rule behind.
	e.m.Close()
	e.assertMasqFor()
}

// TestPluginMasquerade: with masquerade = plugin the bridge plugin does it per pod,
// as before, and crisp installs nothing.
func TestPluginMasquerade(t *testing.T) {
	e := newEnv(t, withMasquerade(MasqueradePlugin))
	o := e.outside()
	p := e.pod("p")
	r := e.setup(p)
	if len(natRules(t, p.ID)) == 0 {
		t.Error("no per-pod masquerade chain with masquerade = plugin")
	}
	if masqFamilies(e.chain)[0].chainExists() {
		t.Errorf("chain %s exists with masquerade = plugin: %v", e.chain, e.masqRules())
	}
	if got, err := o.reach(t, p); err != nil || got != o.hostIP.String() {
		t.Errorf("pod -> outside: saw %q, %v; want %s", got, err, o.hostIP)
	}
	e.teardown(p)
	e.assertReleased(p, r.IP)
}

// TestMasqueradeSwitch: a pod set up while the plugin masqueraded is torn down by a
// restarted crisp that masquerades itself with the plugin's ipMasq (libcni's cached
// config), so its chain goes; and a pod set up with the runtime masquerade keeps its
// rule across a restart with masquerade = plugin until it is gone.
func TestMasqueradeSwitch(t *testing.T) {
	e := newEnv(t, withMasquerade(MasqueradePlugin))
	old := e.pod("old")
	rOld := e.setup(old)
	if len(natRules(t, old.ID)) == 0 {
		t.Fatal("no per-pod chain with masquerade = plugin: the test would prove nothing")
	}

	e.m.Close()
	e.m = e.newManager(MasqueradeRuntime)
	e.assertMasqFor(e.subnet)
	cur := e.pod("cur")
	rCur := e.setup(cur)
	if rules := natRules(t, cur.ID); len(rules) > 0 {
		t.Errorf("per-pod NAT rules with the runtime masquerade:\n%s", strings.Join(rules, "\n"))
	}
	e.teardown(old)
	e.assertReleased(old, rOld.IP)
	if out, _ := exec.Command("iptables-save", "-t", "nat").Output(); strings.Contains(string(out), old.ID) {
		t.Errorf("rules naming %s left after its teardown:\n%s", old.ID, out)
	}

	// Back to the plugin: cur still relies on the rule, which stays until it goes.
	e.m.Close()
	e.m = e.newManager(MasqueradePlugin)
	e.assertMasqFor(e.subnet)
	e.teardown(cur)
	e.assertReleased(cur, rCur.IP)
	if err := e.m.syncMasq(context.Background(), e.m.masqSubnets()); err != nil {
		t.Fatal(err)
	}
	if masqFamilies(e.chain)[0].chainExists() {
		t.Errorf("chain %s left with masquerade = plugin and no pod needing it: %v", e.chain, e.masqRules())
	}
	e.assertMasqFor()
}

// TestMasqueradeResync: stale and duplicated rules in crisp's chain are replaced at
// startup, another instance's are left alone, and a new pod CIDR gets its rule while
// the old one's stays for its pods.
func TestMasqueradeResync(t *testing.T) {
	e := newEnv(t)
	f := masqFamilies(e.chain)[0]
	owner := e.m.masq.owner
	stale := freeSubnet(t)
	changed := append([]string{"-A", e.chain}, masqRule(e.subnet, owner)...)
	changed[slices.Index(changed, "MULTICAST")] = "BROADCAST"
	others := append([]string{"-A", e.chain}, masqRule(stale, "0000")...)
	for _, args := range [][]string{
		append([]string{"-A", e.chain}, masqRule(stale, owner)...),
		append([]string{"-A", e.chain}, masqRule(e.subnet, owner)...),
		others,
		changed,
	} {
		if _, err := f.run(context.Background(), args...); err != nil {
			t.Fatal(err)
		}
	}
	// What a restart does (without Close, which would clean up first).
	if err := e.m.syncMasq(context.Background(), e.m.masqSubnets()); err != nil {
		t.Fatal(err)
	}
	e.assertMasqFor(e.subnet)
	check := append([]string{"-C"}, others[1:]...)
	if _, err := f.run(context.Background(), check...); err != nil {
		t.Errorf("another instance's rule was removed: %v", err)
	}

	p := e.pod("before")
	r := e.setup(p)
	next := freeSubnet(t)
	for next.Contains(e.subnet.IP) {
		next = freeSubnet(t)
	}
	res, err := e.m.SetPodCIDR(next.String())
	if err != nil || !res.Applied {
		t.Fatalf("SetPodCIDR = %+v, %v", res, err)
	}
	// (No pod of the new subnet: the bridge plugin refuses a second IPv4 gateway.)
	e.assertMasqFor(e.subnet, next)
	e.teardown(p)
	e.assertReleased(p, r.IP)
	if err := e.m.syncMasq(context.Background(), e.m.masqSubnets()); err != nil {
		t.Fatal(err)
	}
	e.assertMasqFor(next)
	// With nothing to masquerade, the chain stays for the other instance's rule.
	e.m.Close()
	e.m = e.newManager(MasqueradePlugin)
	e.assertMasqFor()
	if _, err := f.run(context.Background(), check...); err != nil {
		t.Errorf("another instance's rule was removed: %v", err)
	}
}

// TestMasqueradeFailureFailsSetup: when the rule cannot be installed, Setup fails as
// Unavailable, naming the subnet and iptables' complaint, before any plugin ran.
func TestMasqueradeFailureFailsSetup(t *testing.T) {
	// A chain name iptables refuses (more than 28 characters).
	e := newEnv(t, func(e *env) { e.chain = "CRT-MASQ-THIS-NAME-IS-FAR-TOO-LONG-" + strings.ToUpper(randHex(t, 2)) })
	p := e.pod("nonat")
	_, err := e.m.Setup(context.Background(), p)
	if err == nil {
		t.Fatal("Setup succeeded without its masquerade rule")
	}
	if !errdefs.IsUnavailable(err) {
		t.Errorf("error is not Unavailable: %v", err)
	}
	for _, w := range []string{e.subnet.String(), "iptables", p.ID, "cni.masquerade"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	if n := e.bridgePortsIfAny(); n != 0 {
		t.Errorf("%d veths on the bridge: a plugin ran", n)
	}
}

// bridgePortsIfAny is bridgePorts, 0 when no plugin ever made the bridge.
func (e *env) bridgePortsIfAny() int {
	if _, err := netlink.LinkByName(e.bridge); err != nil {
		return 0
	}
	return e.bridgePorts()
}

// BenchmarkPodNetwork times one pod's Setup and Teardown (CNI ADD and DEL of the
// default network: bridge with ipMasq, host-local, portmap) with each masquerade.
func BenchmarkPodNetwork(b *testing.B) {
	for _, mode := range []Masquerade{MasqueradePlugin, MasqueradeRuntime} {
		b.Run(string(mode), func(b *testing.B) {
			e := newEnv(b, withMasquerade(mode))
			var add, del time.Duration
			for i := 0; b.Loop(); i++ {
				path, err := netns.New(e.nsDir, fmt.Sprintf("bench-%s-%d", randHex(b, 3), i))
				if err != nil {
					b.Fatal(err)
				}
				p := Pod{ID: filepath.Base(path), NetNS: path, Name: "bench", Namespace: "crisp-test"}
				start := time.Now()
				if _, err := e.m.Setup(context.Background(), p); err != nil {
					b.Fatal(err)
				}
				mid := time.Now()
				if err := e.m.Teardown(context.Background(), p); err != nil {
					b.Fatal(err)
				}
				add, del = add+mid.Sub(start), del+time.Since(mid)
				if err := netns.Remove(path); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(ms(add)/float64(b.N), "setup-ms/op")
			b.ReportMetric(ms(del)/float64(b.N), "teardown-ms/op")
		})
	}
}

// TestMasqueradeIPv6: an IPv6 pod subnet gets its rule from ip6tables, and the IPv6
// chain goes when no subnet needs it any more.
func TestMasqueradeIPv6(t *testing.T) {
	e := newEnv(t)
	f6 := masqFamilies(e.chain)[1]
	_, v6, _ := net.ParseCIDR("fd00:" + randHex(t, 2) + "::/64")
	if err := e.m.syncMasq(context.Background(), []*net.IPNet{e.subnet, v6}); err != nil {
		t.Fatal(err)
	}
	e.assertMasqFor(e.subnet)
	if _, err := f6.run(context.Background(), append([]string{"-C", e.chain}, masqRule(v6, e.m.masq.owner)...)...); err != nil {
		t.Errorf("no ip6tables rule for %s: %v", v6, err)
	}
	if _, err := f6.run(context.Background(), append([]string{"-C", "POSTROUTING"}, f6.jump()...)...); err != nil {
		t.Errorf("no ip6tables jump to %s: %v", e.chain, err)
	}
	if err := e.m.syncMasq(context.Background(), []*net.IPNet{e.subnet}); err != nil {
		t.Fatal(err)
	}
	if f6.chainExists() {
		t.Errorf("ip6tables chain %s left without IPv6 subnets", e.chain)
	}
	e.assertMasqFor(e.subnet)
}
