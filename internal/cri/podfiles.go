package cri

import (
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/podfiles"
)

// podFiles writes /etc/hostname, /etc/hosts and /etc/resolv.conf for a pod into dir
// (podfiles.Write, which crisp's shim uses for containerd's pods too).
func podFiles(dir, hostname, ip string, cfg *runtime.PodSandboxConfig, hostNet bool) error {
	return podfiles.Write(dir, podfiles.Pod{Hostname: hostname, IP: ip, HostNetwork: hostNet, DNS: podDNS(cfg.GetDnsConfig())})
}

// podDNS is a CRI DNS config in podfiles' terms.
func podDNS(d *runtime.DNSConfig) podfiles.DNS {
	return podfiles.DNS{Servers: d.GetServers(), Searches: d.GetSearches(), Options: d.GetOptions()}
}
