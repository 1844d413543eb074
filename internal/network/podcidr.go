package network

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/crisp-runtime/crisp/internal/atomicfile"
)

// ErrInvalidPodCIDR is wrapped by errors about a pod CIDR that cannot be used.
var ErrInvalidPodCIDR = errors.New("invalid pod CIDR")

// ParsePodCIDRs parses a pod CIDR as kubelet sends it in UpdateRuntimeConfig: one
// CIDR, or an IPv4 and an IPv6 CIDR joined by a comma (a dual-stack node's
// spec.podCIDRs). Each comes back as its network (host bits cleared), in the order
// given. The ranges must leave host-local room for a gateway and a pod, and must not
// be loopback, link-local, multicast or unspecified.
func ParsePodCIDRs(s string) ([]*net.IPNet, error) {
	var out []*net.IPNet
	families := map[bool]string{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		ip, n, err := net.ParseCIDR(part)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %q is not a CIDR such as 10.244.1.0/24 or fd00:10:244:1::/64", ErrInvalidPodCIDR, s, part)
		}
		v4 := ip.To4() != nil
		if prev, dup := families[v4]; dup {
			return nil, fmt.Errorf("%w %q: %s and %s are of the same IP family; give at most one IPv4 and one IPv6 CIDR", ErrInvalidPodCIDR, s, prev, part)
		}
		families[v4] = part
		ones, bits := n.Mask.Size()
		if bits-ones < 2 {
			return nil, fmt.Errorf("%w %q: %s has no room for a gateway and a pod (at most /%d)", ErrInvalidPodCIDR, s, part, bits-2)
		}
		if ip.IsLoopback() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast() || n.IP.IsUnspecified() {
			return nil, fmt.Errorf("%w %q: %s is not a range pods can be given addresses from", ErrInvalidPodCIDR, s, part)
		}
		out = append(out, n)
	}
	return out, nil
}

// joinCIDRs is the canonical form of a list of CIDRs, as stored and compared.
func joinCIDRs(nets []*net.IPNet) string {
	parts := make([]string, len(nets))
	for i, n := range nets {
		parts[i] = n.String()
	}
	return strings.Join(parts, ",")
}

// PodCIDRResult says what SetPodCIDR did.
type PodCIDRResult struct {
	// PodCIDR is the canonical form of what was set.
	PodCIDR string
	// Changed: it differs from what crisp's default network used before.
	Changed bool
	// Applied: crisp's generated default config now uses it (it was rewritten, or
	// written because the config dir had no config). False when the default config
	// file was edited by someone or replaced by an operator's: that file is not
	// crisp's to rewrite.
	Applied bool
	// ActiveFile is the config new pods are attached with; when it is not crisp's
	// default, the pod CIDR does not affect new pods (the cluster network, e.g.
	// flannel or calico, allocates addresses itself).
	ActiveFile string
}

// SetPodCIDR makes cidr (see ParsePodCIDRs) the subnet of crisp's generated default
// network: it is kept in Config.PodCIDRFile, so it survives a restart of criserver
// and wins over Config.DefaultSubnet, and crisp's own 99-crisp.conflist is rewritten
// if it is still exactly what crisp wrote. Pods created afterwards get addresses in
// it; running pods keep theirs (they are torn down with the config they were set up
// with). An operator's config is never touched.
func (m *Manager) SetPodCIDR(cidr string) (PodCIDRResult, error) {
	res, err := m.setPodCIDR(cidr)
	if err == nil {
		// The new subnet's rule goes in now and the old one's goes once no pod uses it.
		// A failure is retried by the next pod's Setup, which fails with it.
		if err := m.syncMasq(m.ctx, m.masqSubnets()); err != nil {
			m.log.Error("update pod subnet masquerade rules for new pod CIDR", "pod_cidr", res.PodCIDR, "err", err)
		}
	}
	return res, err
}

func (m *Manager) setPodCIDR(cidr string) (PodCIDRResult, error) {
	nets, err := ParsePodCIDRs(cidr)
	if err != nil {
		return PodCIDRResult{}, err
	}
	canon := joinCIDRs(nets)
	m.mu.Lock()
	defer m.mu.Unlock()
	res := PodCIDRResult{PodCIDR: canon, Changed: canon != m.cfg.DefaultSubnet}
	if err := writeFileAtomic(m.cfg.PodCIDRFile, []byte(canon+"\n")); err != nil {
		return res, fmt.Errorf("keep pod CIDR %s: %w", canon, err)
	}
	old := m.cfg.DefaultSubnet
	m.cfg.DefaultSubnet = canon
	applied, err := m.applyDefaultLocked(old)
	if err != nil {
		return res, err
	}
	res.Applied = applied
	// Rescan now rather than trusting file stamps, so the very next pod sees it.
	m.state = nil
	m.reloadLocked()
	res.ActiveFile = m.state.file
	return res, nil
}

// applyDefaultLocked makes crisp's default config file match m.cfg: it writes it when
// the config dir has no config at all, and rewrites it when it is crisp's own
// generated file for another subnet (prevSubnet, or any other: a restart may come
// with a new default_subnet). It reports whether the file now carries m.cfg's subnet.
func (m *Manager) applyDefaultLocked(prevSubnet string) (bool, error) {
	wrote, err := writeDefault(m.cfg)
	if err != nil {
		return false, err
	}
	if wrote {
		m.log.Info("wrote default CNI network config", "file", filepath.Join(m.cfg.ConfDir, DefaultConfName),
			"bridge", m.cfg.DefaultBridge, "subnet", m.cfg.DefaultSubnet)
		return true, nil
	}
	path := filepath.Join(m.cfg.ConfDir, DefaultConfName)
	cur, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		// Another config exists and crisp's was never written or was removed.
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	want, err := defaultConfList(m.cfg)
	if err != nil {
		return false, err
	}
	if bytes.Equal(cur, want) {
		return true, nil
	}
	if !isGeneratedDefault(cur, m.cfg) {
		m.log.Warn("CNI config has crisp's default name but not the content crisp generates: leaving it alone, pod CIDR not applied to it",
			"file", path, "subnet", m.cfg.DefaultSubnet)
		return false, nil
	}
	if err := writeFileAtomic(path, want); err != nil {
		return false, fmt.Errorf("rewrite default CNI config: %w", err)
	}
	m.log.Info("rewrote default CNI network config for new pod subnet", "file", path,
		"old_subnet", subnetsOf(cur), "subnet", m.cfg.DefaultSubnet, "previous_setting", prevSubnet)
	return true, nil
}

// isGeneratedDefault reports whether data is byte for byte what defaultConfList
// writes for cfg with some subnet: crisp's own file, untouched by anyone. An edited
// file (another plugin, an option changed, even reformatted) is the operator's.
func isGeneratedDefault(data []byte, cfg Config) bool {
	subnets := subnetsOf(data)
	if subnets == "" {
		return false
	}
	cfg.DefaultSubnet = subnets
	gen, err := defaultConfList(cfg)
	return err == nil && bytes.Equal(gen, data)
}

// subnetsOf extracts the host-local subnets of a config shaped like crisp's default,
// joined by commas; "" if it is not shaped like it.
func subnetsOf(data []byte) string {
	var c struct {
		Plugins []struct {
			IPAM struct {
				Ranges [][]struct {
					Subnet string `json:"subnet"`
				} `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if json.Unmarshal(data, &c) != nil || len(c.Plugins) == 0 {
		return ""
	}
	var subnets []string
	for _, r := range c.Plugins[0].IPAM.Ranges {
		if len(r) != 1 {
			return ""
		}
		subnets = append(subnets, r[0].Subnet)
	}
	return strings.Join(subnets, ",")
}

// readPodCIDR returns the pod CIDR kept by SetPodCIDR, "" when none was set.
func readPodCIDR(path string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read pod CIDR: %w", err)
	}
	nets, err := ParsePodCIDRs(strings.TrimSpace(string(data)))
	if err != nil {
		return "", fmt.Errorf("pod CIDR kept in %s: %w", path, err)
	}
	return joinCIDRs(nets), nil
}

// writeFileAtomic replaces path with data (atomicfile.WriteSync), creating its
// directory: nobody (kubelet, another runtime, our own reload) ever reads half a file,
// and the temp name has no config extension, so a CNI config dir never chooses it.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return atomicfile.WriteSync(path, data, 0o644)
}
