package network

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"runtime"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The bridge and ptp plugins learn which addresses' ipMasq rules to delete from the
// pod's interface. When the namespace is already gone they release the IP but leave
// the NAT chain behind (containernetworking/plugins#810; Debian's 1.1.1 and later
// upstream releases alike). For those plugins, Teardown of a pod whose namespace is
// gone builds a stand-in namespace carrying the cached addresses so their DEL can
// finish the job.

// needsStandIn reports whether list has a plugin that leaks without the pod's namespace.
func needsStandIn(list *libcni.NetworkConfigList) bool {
	for _, p := range list.Plugins {
		if p.Network.Type != "bridge" && p.Network.Type != "ptp" {
			continue
		}
		var c struct {
			IPMasq bool `json:"ipMasq"`
		}
		if json.Unmarshal(p.Bytes, &c) == nil && c.IPMasq {
			return true
		}
	}
	return false
}

// cachedAddrs returns the pod-side addresses of the cached result, if any.
func (m *Manager) cachedAddrs(list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) []*net.IPNet {
	raw, err := m.cni.GetNetworkListCachedResult(list, rt)
	if err != nil || raw == nil {
		return nil
	}
	r, err := types100.NewResultFromResult(raw)
	if err != nil {
		return nil
	}
	var addrs []*net.IPNet
	for _, ipc := range r.IPs {
		if ipc == nil || ipc.Address.IP == nil {
			continue
		}
		if ipc.Interface != nil && *ipc.Interface >= 0 && *ipc.Interface < len(r.Interfaces) && r.Interfaces[*ipc.Interface].Sandbox == "" {
			continue
		}
		a := ipc.Address
		addrs = append(addrs, &a)
	}
	return addrs
}

// withStandIn runs fn with the path of a throwaway network namespace in which
// interface ifName holds addrs. The namespace lives only as long as one locked
// thread, so nothing is mounted and nothing is left when fn returns.
func withStandIn(ifName string, addrs []*net.IPNet, fn func(nsPath string) error) error {
	ready := make(chan error, 1)
	done := make(chan struct{})
	var path string
	go func() {
		// Never unlocked, so a thread that cannot get back out is not reused. It goes
		// back all the same: Go parks the main thread forever rather than ending it,
		// which would keep the stand-in alive.
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ready <- fmt.Errorf("open current network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- fmt.Errorf("unshare stand-in network namespace: %w", err)
			return
		}
		defer func() { _ = unix.Setns(orig, unix.CLONE_NEWNET) }()
		// A veth pair because it is what the plugins created in the first place, so its
		// driver is loaded wherever they work; dummy may not be built.
		link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ifName}, PeerName: "standin-peer"}
		if err := netlink.LinkAdd(link); err != nil {
			ready <- fmt.Errorf("create stand-in %s: %w", ifName, err)
			return
		}
		for _, a := range addrs {
			if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: a}); err != nil {
				ready <- fmt.Errorf("add %s to stand-in %s: %w", a, ifName, err)
				return
			}
		}
		path = fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		ready <- nil
		<-done
	}()
	if err := <-ready; err != nil {
		return err
	}
	defer close(done)
	return fn(path)
}
