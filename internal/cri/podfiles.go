package cri

import (
	"fmt"

	"github.com/opencontainers/selinux/go-selinux/label"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/podfiles"
)

// podFiles writes /etc/hostname, /etc/hosts and /etc/resolv.conf for a pod into dir
// (podfiles.Write, which crisp's shim uses for containerd's pods too) and gives them
// the pod's SELinux mount label ("" leaves them as they are): containerd relabels
// them for its containers the same way.
func podFiles(dir, hostname, ip string, cfg *runtime.PodSandboxConfig, hostNet bool, mountLabel string) error {
	if err := podfiles.Write(dir, podfiles.Pod{Hostname: hostname, IP: ip, HostNetwork: hostNet, DNS: podDNS(cfg.GetDnsConfig())}); err != nil {
		return err
	}
	if mountLabel == "" {
		return nil
	}
	ps := podfiles.In(dir, false)
	for _, f := range []string{ps.Hostname, ps.Hosts, ps.Resolv} {
		if err := label.SetFileLabel(f, mountLabel); err != nil {
			return fmt.Errorf("label %s %s: %w", f, mountLabel, err)
		}
	}
	return nil
}

// podDNS is a CRI DNS config in podfiles' terms.
func podDNS(d *runtime.DNSConfig) podfiles.DNS {
	return podfiles.DNS{Servers: d.GetServers(), Searches: d.GetSearches(), Options: d.GetOptions()}
}
