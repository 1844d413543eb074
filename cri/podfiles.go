package cri

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Names of the files every pod gets for its containers to bind-mount.
const (
	hostnameFile = "hostname"
	hostsFile    = "hosts"
	resolvFile   = "resolv.conf"
)

// podFiles writes /etc/hostname, /etc/hosts and /etc/resolv.conf for a pod into dir.
// The host's own files are used where the pod shares the host's network and where
// kubelet gave no DNS config, as containerd and CRI-O do.
func podFiles(dir, hostname, ip string, cfg *runtime.PodSandboxConfig, hostNet bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create pod dir: %w", err)
	}
	if err := writeFile(filepath.Join(dir, hostnameFile), []byte(hostname+"\n")); err != nil {
		return err
	}
	var hosts []byte
	if hostNet {
		data, err := os.ReadFile("/etc/hosts")
		if err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("read host /etc/hosts: %w", err)
		}
		hosts = data
	} else {
		var b bytes.Buffer
		b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")
		if ip != "" && hostname != "" {
			fmt.Fprintf(&b, "%s\t%s\n", ip, hostname)
		}
		hosts = b.Bytes()
	}
	if err := writeFile(filepath.Join(dir, hostsFile), hosts); err != nil {
		return err
	}
	resolv, err := resolvConf(cfg.GetDnsConfig())
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, resolvFile), resolv)
}

// resolvConf renders the pod's resolv.conf from the CRI DNS config, or copies the
// host's when kubelet gave none.
func resolvConf(dns *runtime.DNSConfig) ([]byte, error) {
	if len(dns.GetServers()) == 0 && len(dns.GetSearches()) == 0 && len(dns.GetOptions()) == 0 {
		data, err := os.ReadFile("/etc/resolv.conf")
		if err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("read host /etc/resolv.conf: %w", err)
		}
		return data, nil
	}
	var b bytes.Buffer
	if len(dns.GetSearches()) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(dns.GetSearches(), " "))
	}
	for _, s := range dns.GetServers() {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(dns.GetOptions()) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(dns.GetOptions(), " "))
	}
	return b.Bytes(), nil
}

// writeFile replaces path atomically so a container never sees half a file.
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
