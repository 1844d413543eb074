package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/config"
)

// assertPodGone checks that nothing of a removed pod is left on the node.
func (e *env) assertPodGone(t *testing.T, id string, info podInfo) {
	t.Helper()
	if alive(info.ShimPid) {
		t.Errorf("pod %s: shim %d still running", id, info.ShimPid)
	}
	if alive(info.Pid) {
		t.Errorf("pod %s: pause %d still running", id, info.Pid)
	}
	if info.NetNS != "" {
		if _, err := os.Stat(info.NetNS); !os.IsNotExist(err) {
			t.Errorf("pod %s: netns %s still there (err %v)", id, info.NetNS, err)
		}
	}
	for _, m := range mountsUnder(e.dir) {
		if strings.Contains(m, id) {
			t.Errorf("pod %s: mount %s left", id, m)
		}
	}
	if _, err := os.Stat(filepath.Join(e.state, "sandboxes", id)); !os.IsNotExist(err) {
		t.Errorf("pod %s: bundle left (err %v)", id, err)
	}
	if _, err := os.Stat(info.PodDir); info.PodDir != "" && !os.IsNotExist(err) {
		t.Errorf("pod %s: pod dir %s left", id, info.PodDir)
	}
	if a := strings.TrimPrefix(info.ShimAddress, "unix://"); a != "" {
		if _, err := os.Stat(a); !os.IsNotExist(err) {
			t.Errorf("pod %s: shim socket %s left", id, a)
		}
	}
	for _, cg := range e.podCgroups() {
		if strings.Contains(cg, id) {
			t.Errorf("pod %s: cgroup %s left", id, cg)
		}
	}
}

// assertNodeClean checks the node-wide leftovers once every pod is gone. The warm
// spare shims criserver keeps (at most one per handler) are expected; their bundle,
// socket and process are not leftovers.
func (e *env) assertNodeClean(t *testing.T) {
	t.Helper()
	// The spares are listed after everything else: one that starts meanwhile (a
	// pod just took the last) is then known by the time its files are judged.
	var bundles, sockets []os.DirEntry
	var procs []string
	var spares []warmSpare
	names := func(entries []os.DirEntry) []string {
		out := make([]string, 0, len(entries))
		for _, en := range entries {
			out = append(out, en.Name())
		}
		return withoutSpares(out, spares)
	}
	// A spare refilled after the last pod took one has its socket and bundle a moment
	// before it is known as a spare: look again for a while before calling them left.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		bundles, _ = os.ReadDir(filepath.Join(e.state, "sandboxes"))
		sockets, _ = os.ReadDir(filepath.Join(e.state, "s"))
		procs = e.shimProcesses()
		spares = e.warmSpares()
		if len(names(bundles))+len(names(sockets)) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if extra := spareExcess(spares); len(extra) > 0 {
		t.Errorf("warm spare shims beyond one per handler: %v", extra)
	}
	if r := e.ipamReservations(); len(r) > 0 {
		t.Errorf("IPAM reservations left: %v", r)
	}
	if v := e.vethsOnBridge(); len(v) > 0 {
		t.Errorf("veths left on %s: %v", e.bridge, v)
	}
	if cg := e.podCgroups(); len(cg) > 0 {
		t.Errorf("pod cgroups left: %v", cg)
	}
	entries, _ := os.ReadDir(filepath.Join(e.state, "netns"))
	if len(entries) > 0 {
		t.Errorf("netns pins left: %d", len(entries))
	}
	if left := names(bundles); len(left) > 0 {
		t.Errorf("bundles left: %v", left)
	}
	if left := names(sockets); len(left) > 0 {
		t.Errorf("shim sockets left: %v", left)
	}
	if procs := withoutSpares(procs, spares); len(procs) > 0 {
		t.Errorf("shim or pause processes left: %v", procs)
	}
}

// shimProcesses lists processes started for this env: shims carry its bundle paths
// on their command line, pause processes carry them in their environment.
func (e *env) shimProcesses() []string {
	var out []string
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if pid, err := strconv.Atoi(d.Name()); err != nil || pid == os.Getpid() || (e.cmd != nil && pid == e.cmd.Process.Pid) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		environ, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		if strings.Contains(string(cmdline), e.state) || strings.Contains(string(environ), e.state) {
			out = append(out, d.Name()+":"+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}

// removeSurvivors checks that every pod criserver lists after a restart that cut a
// pod start short is whole (ready, with an IP), then stops and removes it and checks
// that it left nothing; why names the case in errors.
func (e *env) removeSurvivors(ctx context.Context, t *testing.T, why string) {
	t.Helper()
	list, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		st, info := e.status(ctx, p.Id)
		if st.State != cri.PodSandboxState_SANDBOX_READY || st.Network.Ip == "" {
			t.Errorf("%s: surviving pod %s is %v with IP %q", why, p.Id, st.State, st.Network.Ip)
		}
		e.stopRemove(ctx, t, p.Id)
		e.assertPodGone(t, p.Id, info)
	}
}

func (e *env) stopRemove(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	if err := stopRemovePod(ctx, e.rt, id); err != nil {
		t.Fatal(err)
	}
}

// stopRemovePod stops and removes pod id as kubelet does, through crisp's or
// containerd's CRI; the remove is tried even after a failed stop.
func stopRemovePod(ctx context.Context, rt cri.RuntimeServiceClient, id string) error {
	_, serr := rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id})
	if serr != nil {
		serr = fmt.Errorf("StopPodSandbox %s: %w", id, serr)
	}
	_, rerr := rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id})
	if rerr != nil {
		rerr = fmt.Errorf("RemovePodSandbox %s: %w", id, rerr)
	}
	return errors.Join(serr, rerr)
}

func TestE2EConcurrentPodsNetworking(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)

	const n = 3
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: e.podConfig(fmt.Sprintf("net%d", i))})
			if err != nil {
				t.Errorf("RunPodSandbox %d: %v", i, err)
				return
			}
			ids[i] = resp.PodSandboxId
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	_, subnet, _ := net.ParseCIDR(e.subnet)
	seen := map[string]bool{}
	infos := make([]podInfo, n)
	ports := make([]int, n)
	for i, id := range ids {
		st, info := e.status(ctx, id)
		infos[i] = info
		if st.State != cri.PodSandboxState_SANDBOX_READY {
			t.Fatalf("pod %d state %v", i, st.State)
		}
		ip := st.GetNetwork().GetIp()
		if !subnet.Contains(net.ParseIP(ip)) || seen[ip] {
			t.Fatalf("pod %d IP %q: not in %s or not distinct", i, ip, e.subnet)
		}
		seen[ip] = true
		addr := nsenterOut(t, "--net="+info.NetNS, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if !strings.Contains(addr, " "+ip+"/") {
			t.Errorf("pod %d eth0 lacks %s: %s", i, ip, addr)
		}
		if route := nsenterOut(t, "--net="+info.NetNS, "ip", "route", "show", "default"); !strings.Contains(route, "default via") {
			t.Errorf("pod %d has no default route: %q", i, route)
		}
		if lo := nsenterOut(t, "--net="+info.NetNS, "ip", "-o", "link", "show", "lo"); !strings.Contains(lo, "UP") && !strings.Contains(lo, "state UNKNOWN") {
			t.Errorf("pod %d loopback not up: %s", i, lo)
		}
		// The pause process holds the pod's namespaces.
		if nsInode(t, fmt.Sprintf("/proc/%d/ns/net", info.Pid)) != nsInode(t, info.NetNS) {
			t.Errorf("pod %d pause is not in the pod netns", i)
		}
		if h := nsenterOut(t, "--uts", "-t", fmt.Sprint(info.Pid), "hostname"); strings.TrimSpace(h) != fmt.Sprintf("net%d", i) {
			t.Errorf("pod %d hostname %q", i, h)
		}
		ports[i] = echoServer(t, info.NetNS, fmt.Sprintf("pod%d", i))
	}
	// Host -> every pod, and every pod -> the next.
	for i, id := range ids {
		st, _ := e.status(ctx, id)
		addr := net.JoinHostPort(st.Network.Ip, fmt.Sprint(ports[i]))
		if got := exchange(t, "", addr); got != fmt.Sprintf("pod%d:ping", i) {
			t.Errorf("host -> pod %d: %q", i, got)
		}
		from := infos[(i+1)%n].NetNS
		if got := exchange(t, from, addr); got != fmt.Sprintf("pod%d:ping", i) {
			t.Errorf("pod %d -> pod %d: %q", (i+1)%n, i, got)
		}
	}
	// List with filters.
	list, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{LabelSelector: map[string]string{"pod": "net1"}}})
	if err != nil || len(list.Items) != 1 || list.Items[0].Id != ids[1] {
		t.Fatalf("label filter: %v %v", list, err)
	}
	list, err = e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{Id: ids[2][:12]}})
	if err != nil || len(list.Items) != 1 || list.Items[0].Id != ids[2] {
		t.Fatalf("id prefix filter: %v %v", list, err)
	}

	for i, id := range ids {
		e.stopRemove(ctx, t, id)
		e.assertPodGone(t, id, infos[i])
	}
	e.assertNodeClean(t)
	list, err = e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("pods left listed: %v %v", list, err)
	}
}

func TestE2EHostNetworkAndDNS(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)

	cfg := e.podConfig("hostnet")
	cfg.Linux.SecurityContext.NamespaceOptions.Network = cri.NamespaceMode_NODE
	cfg.DnsConfig = &cri.DNSConfig{Servers: []string{"10.96.0.10"}, Searches: []string{"e2e.svc.cluster.local", "svc.cluster.local"}, Options: []string{"ndots:5"}}
	id := e.runPod(ctx, cfg)
	st, info := e.status(ctx, id)
	if st.State != cri.PodSandboxState_SANDBOX_READY {
		t.Fatalf("state %v", st.State)
	}
	if info.NetNS != "" {
		t.Errorf("host network pod got a netns %q", info.NetNS)
	}
	if nsInode(t, fmt.Sprintf("/proc/%d/ns/net", info.Pid)) != nsInode(t, "/proc/thread-self/ns/net") {
		t.Errorf("host network pause is not in the host netns")
	}
	if st.Linux.Namespaces.Options.Network != cri.NamespaceMode_NODE {
		t.Errorf("status namespace options: %v", st.Linux.Namespaces.Options)
	}
	resolv, err := os.ReadFile(filepath.Join(info.PodDir, "resolv.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nameserver 10.96.0.10", "search e2e.svc.cluster.local svc.cluster.local", "options ndots:5"} {
		if !strings.Contains(string(resolv), want) {
			t.Errorf("resolv.conf lacks %q:\n%s", want, resolv)
		}
	}
	if _, err := os.Stat(filepath.Join(info.PodDir, "hosts")); err != nil {
		t.Errorf("hosts file: %v", err)
	}

	// A pod with its own PID namespace, sysctls and a POD pid mode.
	cfg2 := e.podConfig("pidpod")
	cfg2.Linux.SecurityContext.NamespaceOptions.Pid = cri.NamespaceMode_POD
	cfg2.Linux.Sysctls = map[string]string{"net.ipv4.ip_unprivileged_port_start": "80", "kernel.shm_rmid_forced": "1"}
	id2 := e.runPod(ctx, cfg2)
	_, info2 := e.status(ctx, id2)
	if nsInode(t, fmt.Sprintf("/proc/%d/ns/pid", info2.Pid)) == nsInode(t, "/proc/thread-self/ns/pid") {
		t.Errorf("pid POD pod shares the host pid namespace")
	}
	if v := nsenterOut(t, "--net="+info2.NetNS, "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"); strings.TrimSpace(v) != "80" {
		t.Errorf("net sysctl in pod = %q", v)
	}
	if v := nsenterOut(t, "--ipc", "-t", fmt.Sprint(info2.Pid), "cat", "/proc/sys/kernel/shm_rmid_forced"); strings.TrimSpace(v) != "1" {
		t.Errorf("ipc sysctl in pod = %q", v)
	}
	if v, _ := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start"); strings.TrimSpace(string(v)) == "80" {
		t.Errorf("pod sysctl leaked to the host")
	}
	e.stopRemove(ctx, t, id)
	e.stopRemove(ctx, t, id2)
	e.assertPodGone(t, id, info)
	e.assertPodGone(t, id2, info2)
	e.assertNodeClean(t)
}

func TestE2ERestartKill9(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	ids := []string{e.runPod(ctx, e.podConfig("survivor1")), e.runPod(ctx, e.podConfig("survivor2"))}
	before := map[string]string{}
	infos := map[string]podInfo{}
	for _, id := range ids {
		st, info := e.status(ctx, id)
		before[id] = st.Network.Ip
		infos[id] = info
	}
	e.kill9()
	for _, id := range ids {
		if !alive(infos[id].ShimPid) || !alive(infos[id].Pid) {
			t.Fatalf("pod %s did not survive criserver's death", id)
		}
	}
	e.start()
	list, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil || len(list.Items) != 2 {
		t.Fatalf("after restart: %v %v", list, err)
	}
	for _, id := range ids {
		st, _ := e.status(ctx, id)
		if st.State != cri.PodSandboxState_SANDBOX_READY || st.Network.Ip != before[id] {
			t.Errorf("pod %s after restart: state %v ip %q (was %q)", id, st.State, st.Network.Ip, before[id])
		}
	}
	// Duplicate names are still reserved after the restart.
	if _, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: e.podConfig("survivor1")}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("duplicate after restart: %v", err)
	}
	// A clean SIGTERM restart too.
	e.stop()
	e.start()
	for _, id := range ids {
		e.stopRemove(ctx, t, id)
		e.assertPodGone(t, id, infos[id])
	}
	e.assertNodeClean(t)
}

func TestE2EShimDeath(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	id := e.runPod(ctx, e.podConfig("doomed"))
	_, info := e.status(ctx, id)
	if err := syscall.Kill(info.ShimPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status.State == cri.PodSandboxState_SANDBOX_NOTREADY {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pod still Ready after its shim was killed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Also across a restart: the dead shim is found dead again.
	e.kill9()
	e.start()
	resp, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil || resp.Status.State != cri.PodSandboxState_SANDBOX_NOTREADY {
		t.Fatalf("after restart: %v %v", resp, err)
	}
	e.stopRemove(ctx, t, id)
	e.assertPodGone(t, id, info)
	e.assertNodeClean(t)
}

func TestE2EBadInput(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	noName := e.podConfig("x")
	noName.Metadata.Name = ""
	hostSysctl := e.podConfig("y")
	hostSysctl.Linux.Sysctls = map[string]string{"kernel.panic": "1"}
	badParent := e.podConfig("z")
	badParent.Linux.CgroupParent = "/crisp/../../etc"
	cases := []struct {
		name    string
		req     *cri.RunPodSandboxRequest
		code    codes.Code
		message string
	}{
		{"nil config", &cri.RunPodSandboxRequest{}, codes.InvalidArgument, "config is required"},
		{"no metadata", &cri.RunPodSandboxRequest{Config: &cri.PodSandboxConfig{}}, codes.InvalidArgument, "metadata"},
		{"empty name", &cri.RunPodSandboxRequest{Config: noName}, codes.InvalidArgument, "metadata.name is empty"},
		{"unknown handler", &cri.RunPodSandboxRequest{Config: e.podConfig("h"), RuntimeHandler: "kata-nope"}, codes.InvalidArgument, `runtime handler "kata-nope"`},
		{"node sysctl", &cri.RunPodSandboxRequest{Config: hostSysctl}, codes.InvalidArgument, "kernel.panic"},
		{"cgroup escape", &cri.RunPodSandboxRequest{Config: badParent}, codes.InvalidArgument, "cgroup_parent"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.rt.RunPodSandbox(ctx, tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.message) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.code, tc.message)
			}
		})
	}
	// Duplicate name: concurrent calls, exactly one wins, the loser names the winner.
	var wg sync.WaitGroup
	results := make([]error, 4)
	winners := make([]string, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: e.podConfig("dup")})
			results[i] = err
			if err == nil {
				winners[i] = resp.PodSandboxId
			}
		}()
	}
	wg.Wait()
	var winner string
	for i, err := range results {
		if err == nil {
			if winner != "" {
				t.Fatalf("two pods created for one name")
			}
			winner = winners[i]
		}
	}
	for _, err := range results {
		if err != nil && (status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), winner)) {
			t.Errorf("duplicate: %v (winner %s)", err, winner)
		}
	}
	// Unknown ids: stop/remove succeed, status is NotFound.
	if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: "nope"}); err != nil {
		t.Errorf("stop unknown: %v", err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: "nope"}); err != nil {
		t.Errorf("remove unknown: %v", err)
	}
	if _, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("status unknown: %v", err)
	}
	if _, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: "x"}); status.Code(err) != codes.NotFound {
		t.Errorf("ContainerStats of an unknown container: %v, want NotFound", err)
	}
	// Only the winner exists; after removing it nothing is left.
	list, _ := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if len(list.GetItems()) != 1 {
		t.Fatalf("pods after bad input: %d", len(list.GetItems()))
	}
	_, info := e.status(ctx, winner)
	e.stopRemove(ctx, t, winner)
	// Stop and remove again: idempotent.
	e.stopRemove(ctx, t, winner)
	e.assertPodGone(t, winner, info)
	e.assertNodeClean(t)
}

func TestE2ERuntimeStatus(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	v, err := e.rt.Version(ctx, &cri.VersionRequest{})
	if err != nil || v.RuntimeName != "crisp" || v.RuntimeApiVersion != "v1" {
		t.Fatalf("Version: %v %v", v, err)
	}
	st, err := e.rt.Status(ctx, &cri.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	conds := map[string]bool{}
	for _, c := range st.Status.Conditions {
		conds[c.Type] = c.Status
	}
	if !conds[cri.RuntimeReady] || !conds[cri.NetworkReady] {
		t.Fatalf("conditions: %v", st.Status.Conditions)
	}
	if st.Info["config"] == "" {
		t.Errorf("verbose status has no config")
	}
	rc, err := e.rt.RuntimeConfig(ctx, &cri.RuntimeConfigRequest{})
	if err != nil || rc.Linux.CgroupDriver != cri.CgroupDriver_CGROUPFS {
		t.Fatalf("RuntimeConfig: %v %v", rc, err)
	}
	// The default network config was written into the empty conf dir.
	if _, err := os.Stat(filepath.Join(e.dir, "net.d", "99-crisp.conflist")); err != nil {
		t.Errorf("default CNI config: %v", err)
	}
}

func TestE2EHostPort(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	const containerPort = 8080
	hostPort := 30000 + int32(time.Now().UnixNano()%20000)
	cfg := e.podConfig("hostport")
	cfg.PortMappings = []*cri.PortMapping{{Protocol: cri.Protocol_TCP, ContainerPort: containerPort, HostPort: hostPort}}
	id := e.runPod(ctx, cfg)
	_, info := e.status(ctx, id)
	var l net.Listener
	inNetns(t, info.NetNS, func() {
		var err error
		if l, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", containerPort)); err != nil {
			t.Fatal(err)
		}
	})
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hostport:ok"))
			c.Close()
		}
	}()
	// The bridge's address is local to the host, so portmap's DNAT applies to it.
	_, subnet, _ := net.ParseCIDR(e.subnet)
	gw := subnet.IP.To4()
	gw[3] = 1
	c, err := net.DialTimeout("tcp4", net.JoinHostPort(gw.String(), fmt.Sprint(hostPort)), 3*time.Second)
	if err != nil {
		t.Fatalf("connect to host port %d: %v", hostPort, err)
	}
	buf := make([]byte, 32)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, _ := c.Read(buf)
	c.Close()
	if string(buf[:n]) != "hostport:ok" {
		t.Fatalf("host port answered %q", buf[:n])
	}
	e.stopRemove(ctx, t, id)
	e.assertPodGone(t, id, info)
	e.assertNodeClean(t)
	if _, err := net.DialTimeout("tcp4", net.JoinHostPort(gw.String(), fmt.Sprint(hostPort)), time.Second); err == nil {
		t.Errorf("host port %d still forwarded after the pod was removed", hostPort)
	}
}

func TestE2ECommandLine(t *testing.T) {
	bins := buildBinaries(t)
	server := filepath.Join(bins, "criserver")
	out, err := exec.Command(server, "config", "default").Output()
	if err != nil {
		t.Fatalf("config default: %v", err)
	}
	path := filepath.Join(t.TempDir(), "default.toml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("printed defaults do not load: %v\n%s", err, out)
	}
	if cfg.Socket != "/run/crisp/crisp.sock" || cfg.RootDir != "/var/lib/crisp" || cfg.StateDir != "/run/crisp" {
		t.Errorf("defaults: %+v", cfg)
	}
	if out, err := exec.Command(server, "--version").Output(); err != nil || !strings.Contains(string(out), "crisp") {
		t.Errorf("--version: %q %v", out, err)
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	_ = os.WriteFile(bad, []byte("cgroup_driver = \"nope\"\n"), 0o600)
	out, err = exec.Command(server, "--config", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "cgroup_driver") {
		t.Errorf("bad config: err %v, output %q", err, out)
	}
	if out, err := exec.Command(filepath.Join(bins, "shim-runc"), "--version").Output(); err != nil || !strings.Contains(string(out), "crisp") {
		t.Errorf("shim --version: %q %v", out, err)
	}
}

func TestE2ESocketMode(t *testing.T) {
	e := newEnv(t)
	e.start()
	st, err := os.Stat(e.socket)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o660 || st.Mode()&os.ModeSocket == 0 {
		t.Errorf("socket mode %v, want socket 0660", st.Mode())
	}
	// A second criserver on the same socket refuses to start instead of stealing it.
	out, err := exec.Command(filepath.Join(binDir, "criserver"), "--config", e.cfgPath).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another criserver") {
		t.Errorf("second criserver: err %v, output %q", err, out)
	}
}

func TestE2EFailureHalfwayLeavesNothing(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	// Valid to the CRI, refused by the kernel when the pause process writes it: the
	// failure comes after the netns, CNI and the shim are all set up.
	cfg := e.podConfig("halfway")
	cfg.Linux.Sysctls = map[string]string{"net.ipv4.ip_forward": "not-a-number"}
	_, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg})
	if err == nil {
		t.Fatal("RunPodSandbox with a sysctl the kernel refuses succeeded")
	}
	if !strings.Contains(err.Error(), "ip_forward") {
		t.Errorf("error does not name the sysctl: %v", err)
	}
	list, _ := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if len(list.GetItems()) != 0 {
		t.Errorf("failed pod is listed: %v", list.Items)
	}
	e.assertNodeClean(t)
	// The name was released: the same pod can be run once fixed.
	cfg.Linux.Sysctls = map[string]string{"net.ipv4.ip_forward": "1"}
	id := e.runPod(ctx, cfg)
	_, info := e.status(ctx, id)
	e.stopRemove(ctx, t, id)
	e.assertPodGone(t, id, info)
	e.assertNodeClean(t)
}

func TestE2EKill9DuringRunPodSandbox(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	// Kill criserver at different points of RunPodSandbox; every restart must either
	// have the pod whole or have undone it completely.
	for i, delay := range []time.Duration{2 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 35 * time.Millisecond, 60 * time.Millisecond} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: e.podConfig(fmt.Sprintf("crash%d", i))})
		}()
		time.Sleep(delay)
		e.kill9()
		<-done
		e.start()
		e.removeSurvivors(ctx, t, fmt.Sprintf("delay %v", delay))
		e.assertNodeClean(t)
	}
	log := e.log()
	t.Logf("creations undone on restart: %d; orphan sandboxes removed: %d; stray sockets removed: %d; pods that survived whole: %d",
		strings.Count(log, "undoing pod creation cut short"), strings.Count(log, "removing sandbox with no pod record"),
		strings.Count(log, "removed stray shim socket"), strings.Count(log, "pod sandbox removed"))
}
