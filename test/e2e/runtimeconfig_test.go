package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func podCIDRRequest(cidr string) *cri.UpdateRuntimeConfigRequest {
	return &cri.UpdateRuntimeConfigRequest{RuntimeConfig: &cri.RuntimeConfig{NetworkConfig: &cri.NetworkConfig{PodCidr: cidr}}}
}

func TestE2EUpdateRuntimeConfigPodCIDR(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)

	for _, bad := range []string{"garbage", "10.1.2.0/33", "10.1.0.0/24,10.2.0.0/24", "127.0.0.0/8"} {
		_, err := e.rt.UpdateRuntimeConfig(ctx, podCIDRRequest(bad))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "pod_cidr") {
			t.Errorf("pod CIDR %q: %v, want InvalidArgument naming pod_cidr", bad, err)
		}
	}
	// Empty: nothing to do, as the CRI says.
	if _, err := e.rt.UpdateRuntimeConfig(ctx, podCIDRRequest("")); err != nil {
		t.Fatalf("empty pod CIDR: %v", err)
	}

	// A subnet of this test's own (the harness picks 10.200-239.x.0/24).
	cidr := fmt.Sprintf("10.%d.%d.0/24", 240+rand.IntN(10), rand.IntN(250))
	_, subnet, _ := net.ParseCIDR(cidr)
	if _, err := e.rt.UpdateRuntimeConfig(ctx, podCIDRRequest(cidr)); err != nil {
		t.Fatalf("UpdateRuntimeConfig %s: %v", cidr, err)
	}
	podIP := func(name string) net.IP {
		t.Helper()
		id := e.runPod(ctx, e.podConfig(name))
		st, _ := e.status(ctx, id)
		ip := net.ParseIP(st.GetNetwork().GetIp())
		if ip == nil {
			t.Fatalf("pod %s has no IP", name)
		}
		return ip
	}
	if ip := podIP("after-update"); !subnet.Contains(ip) {
		t.Fatalf("new pod got %s, not in the new pod CIDR %s", ip, cidr)
	}
	conf := filepath.Join(e.dir, "net.d", "99-crisp.conflist")
	if data, err := os.ReadFile(conf); err != nil || !strings.Contains(string(data), `"subnet": "`+cidr+`"`) {
		t.Fatalf("default CNI config not rewritten: %v\n%s", err, data)
	}

	// A restart keeps kubelet's CIDR rather than going back to default_subnet.
	e.stop()
	e.start()
	if ip := podIP("after-restart"); !subnet.Contains(ip) {
		t.Fatalf("pod after restart got %s, not in %s", ip, cidr)
	}

	// An operator's network takes over: it is never rewritten.
	// Its own bridge: crisp's bridge already carries the new CIDR's gateway.
	opBridge := e.bridge + "o"
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", opBridge).Run() })
	op := filepath.Join(e.dir, "net.d", "10-operator.conflist")
	opConf, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "operator", "plugins": []any{
		map[string]any{"type": "bridge", "bridge": opBridge, "isGateway": true, "ipMasq": true,
			"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": e.subnet}}},
				"dataDir": filepath.Join(e.dir, "op-ipam")}},
	}})
	if err := os.WriteFile(op, opConf, 0o644); err != nil {
		t.Fatal(err)
	}
	other := fmt.Sprintf("10.%d.%d.0/24", 250+rand.IntN(5), rand.IntN(250))
	if _, err := e.rt.UpdateRuntimeConfig(ctx, podCIDRRequest(other)); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(op); string(data) != string(opConf) {
		t.Fatalf("operator config rewritten:\n%s", data)
	}
	_, opNet, _ := net.ParseCIDR(e.subnet)
	if ip := podIP("operator-net"); !opNet.Contains(ip) {
		t.Fatalf("pod on the operator's network got %s, not in %s", ip, e.subnet)
	}
}

func TestE2EUpdatePodSandboxResources(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	_, err := e.rt.UpdatePodSandboxResources(ctx, &cri.UpdatePodSandboxResourcesRequest{PodSandboxId: "nope",
		Resources: &cri.LinuxContainerResources{CpuShares: 2}})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("unknown pod: %v, want NotFound", err)
	}
	id := e.runPod(ctx, e.podConfig("resize"))
	_, err = e.rt.UpdatePodSandboxResources(ctx, &cri.UpdatePodSandboxResourcesRequest{PodSandboxId: id,
		Resources: &cri.LinuxContainerResources{CpuShares: -1}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("negative cpu shares: %v, want InvalidArgument", err)
	}
	if _, err := e.rt.UpdatePodSandboxResources(ctx, &cri.UpdatePodSandboxResourcesRequest{PodSandboxId: id}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("nothing given: %v, want InvalidArgument", err)
	}
	req := &cri.UpdatePodSandboxResourcesRequest{PodSandboxId: id,
		Overhead:  &cri.LinuxContainerResources{CpuShares: 10, MemoryLimitInBytes: 1 << 20},
		Resources: &cri.LinuxContainerResources{CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 256 << 20}}
	if _, err := e.rt.UpdatePodSandboxResources(ctx, req); err != nil {
		t.Fatal(err)
	}
	// Recorded, and kept across a restart.
	e.stop()
	e.start()
	resp, err := e.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	// encoding/json matches the protojson keys (cpuShares) case-insensitively.
	var info struct {
		Overhead  *struct{ CPUShares, MemoryLimitInBytes string }
		Resources *struct{ CPUShares, CPUQuota, MemoryLimitInBytes string }
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
		t.Fatal(err)
	}
	if info.Overhead == nil || info.Overhead.CPUShares != "10" || info.Resources == nil ||
		info.Resources.CPUShares != "512" || info.Resources.MemoryLimitInBytes != fmt.Sprint(256<<20) {
		t.Fatalf("verbose info after restart: %s", resp.Info["info"])
	}
}
