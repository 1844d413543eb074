package network

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
)

// Defaults used for the zero values of Config.
const (
	DefaultConfDir     = "/etc/cni/net.d"
	DefaultCacheDir    = "/var/lib/crisp/cni/cache"
	DefaultBridge      = "crisp0"
	DefaultSubnet      = "10.88.0.0/16"
	DefaultIPAMDataDir = "/var/lib/crisp/cni/networks"
	// DefaultConfName is the file written into an empty ConfDir.
	DefaultConfName = "99-crisp.conflist"
	// DefaultNetworkName is the network name in the default config.
	DefaultNetworkName = "crisp"
)

// DefaultBinDirs are searched for plugins when Config.BinDirs is empty: Debian's
// containernetworking-plugins first, then the upstream location.
var DefaultBinDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// confExts are the extensions kubelet and containerd read from a CNI config dir.
var confExts = []string{".conflist", ".conf", ".json"}

// Config says where CNI configs, plugins and state live, and what default network to write.
type Config struct {
	ConfDir  string   // default /etc/cni/net.d
	BinDirs  []string // default [/usr/lib/cni, /opt/cni/bin]
	CacheDir string   // libcni result cache, under crisp's root dir (e.g. /var/lib/crisp/cni/cache)
	// Default network written when ConfDir holds no config:
	DefaultBridge string // "crisp0"
	DefaultSubnet string // e.g. "10.88.0.0/16"
	IPAMDataDir   string // host-local dataDir for the default config (e.g. /var/lib/crisp/cni/networks)
	// PodCIDRFile keeps the pod CIDR kubelet set with UpdateRuntimeConfig; when it
	// exists it wins over DefaultSubnet. Default: pod-cidr next to CacheDir.
	PodCIDRFile string
	// Timeout bounds the ADD, and the DEL, of a pod's network list (all its plugins
	// together); a plugin still running then is killed. Default DefaultTimeout.
	Timeout time.Duration
	// CancelGrace is how long an ADD goes on after its caller gave up before its plugin
	// is killed (within Timeout still): a plugin killed half-way can leave what no DEL
	// finds. Default DefaultCancelGrace.
	CancelGrace time.Duration
	// PendingDir keeps the DELs handed to the background retrier (see pending.go), so
	// that they survive a restart. Default: pending next to CacheDir.
	PendingDir string
	// RetryInterval is the first wait before a pending DEL is retried; it doubles up to
	// maxRetryInterval. Default defaultRetryInterval.
	RetryInterval time.Duration
	// Masquerade says who masquerades pod traffic of bridge networks with ipMasq:
	// MasqueradeRuntime (the default) or MasqueradePlugin.
	Masquerade Masquerade
	// MasqueradeChain is the nat chain crisp keeps its masquerade rules in, default
	// DefaultMasqueradeChain. It holds exactly the rules of one crisp: two instances on
	// one host (tests) need a chain each.
	MasqueradeChain string
}

func (c Config) withDefaults() Config {
	if c.ConfDir == "" {
		c.ConfDir = DefaultConfDir
	}
	if len(c.BinDirs) == 0 {
		c.BinDirs = DefaultBinDirs
	}
	if c.CacheDir == "" {
		c.CacheDir = DefaultCacheDir
	}
	if c.DefaultBridge == "" {
		c.DefaultBridge = DefaultBridge
	}
	if c.DefaultSubnet == "" {
		c.DefaultSubnet = DefaultSubnet
	}
	if c.IPAMDataDir == "" {
		c.IPAMDataDir = DefaultIPAMDataDir
	}
	if c.PodCIDRFile == "" {
		c.PodCIDRFile = filepath.Join(filepath.Dir(c.CacheDir), "pod-cidr")
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.CancelGrace <= 0 {
		c.CancelGrace = DefaultCancelGrace
	}
	if c.PendingDir == "" {
		c.PendingDir = filepath.Join(filepath.Dir(c.CacheDir), "pending")
	}
	if c.RetryInterval <= 0 {
		c.RetryInterval = defaultRetryInterval
	}
	if c.Masquerade == "" {
		c.Masquerade = MasqueradeRuntime
	}
	if c.MasqueradeChain == "" {
		c.MasqueradeChain = DefaultMasqueradeChain
	}
	return c
}

// defaultConfList is the bridge network a fresh node gets. It is CNI 1.0.0, the newest
// version Debian's plugins 1.1.1 speak. There is no loopback plugin: package netns
// brings lo up when it creates the namespace, which saves one exec per pod. ipMasq is
// true so that the file is right on its own (for another runtime, or with
// cni.masquerade = "plugin"); crisp turns it off in memory and masquerades the subnet
// itself (masq.go).
func defaultConfList(c Config) ([]byte, error) {
	if len(c.DefaultBridge) > 15 || strings.ContainsAny(c.DefaultBridge, "/ ") {
		return nil, fmt.Errorf("default bridge name %q: must be at most 15 characters without '/' or spaces", c.DefaultBridge)
	}
	subnets, err := ParsePodCIDRs(c.DefaultSubnet)
	if err != nil {
		return nil, fmt.Errorf("default subnet: %w", err)
	}
	type obj = map[string]any
	// One range set per family (host-local gives the pod one address of each) and a
	// default route per family.
	var ranges [][]obj
	var routes []obj
	for _, n := range subnets {
		ranges = append(ranges, []obj{{"subnet": n.String()}})
		dst := "0.0.0.0/0"
		if n.IP.To4() == nil {
			dst = "::/0"
		}
		routes = append(routes, obj{"dst": dst})
	}
	conf := obj{
		"cniVersion": "1.0.0",
		"name":       DefaultNetworkName,
		"plugins": []obj{
			{
				"type":        "bridge",
				"bridge":      c.DefaultBridge,
				"isGateway":   true,
				"ipMasq":      true,
				"hairpinMode": true,
				"ipam": obj{
					"type":    "host-local",
					"ranges":  ranges,
					"routes":  routes,
					"dataDir": c.IPAMDataDir,
				},
			},
			{
				"type":         "portmap",
				"capabilities": obj{"portMappings": true},
				"snat":         true,
			},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// ConfigFiles lists the CNI config files of dir in the order they are chosen.
func ConfigFiles(dir string) ([]string, error) {
	files, err := libcni.ConfFiles(dir, confExts)
	if err != nil {
		return nil, fmt.Errorf("list CNI configs in %s: %w", dir, err)
	}
	sort.Strings(files)
	return files, nil
}

// writeDefault writes the default config into c.ConfDir unless it already holds one.
// It reports whether it wrote the file.
func writeDefault(c Config) (bool, error) {
	files, err := ConfigFiles(c.ConfDir)
	if err != nil || len(files) > 0 {
		return false, err
	}
	data, err := defaultConfList(c)
	if err != nil {
		return false, err
	}
	if err := writeFileAtomic(filepath.Join(c.ConfDir, DefaultConfName), data); err != nil {
		return false, fmt.Errorf("write default CNI config: %w", err)
	}
	return true, nil
}

// LoadConfigFile parses one config file; a single-plugin .conf/.json is lifted into a list
// (libcni deprecated its helpers for that, but kubelet-era configs still use it).
func LoadConfigFile(path string) (*libcni.NetworkConfigList, error) {
	var list *libcni.NetworkConfigList
	if strings.HasSuffix(path, ".conflist") {
		l, err := libcni.NetworkConfFromFile(path)
		if err != nil {
			return nil, err
		}
		list = l
	} else {
		l, err := loadSingle(path)
		if err != nil {
			return nil, err
		}
		list = l
	}
	if list.Name == "" {
		return nil, errors.New("no network name")
	}
	if len(list.Plugins) == 0 {
		return nil, errors.New("no plugins")
	}
	for i, p := range list.Plugins {
		if p.Network.Type == "" {
			return nil, fmt.Errorf("plugin %d has no type", i)
		}
	}
	return list, nil
}

func loadSingle(path string) (*libcni.NetworkConfigList, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	conf, err := libcni.NetworkPluginConfFromBytes(data)
	if err != nil {
		// Typically a conflist saved with the wrong extension (no top-level "type").
		return nil, fmt.Errorf("%w (a plugin list must be named *.conflist)", err)
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	b, err := json.Marshal(map[string]any{"name": conf.Network.Name, "cniVersion": conf.Network.CNIVersion, "plugins": []any{raw}})
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromBytes(b)
}

// fileStamp identifies one version of a file cheaply.
type fileStamp struct {
	path string
	mod  time.Time
	size int64
}

func stamp(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{path: path}
	}
	return fileStamp{path: path, mod: fi.ModTime(), size: fi.Size()}
}

// confState is what one scan of the config dir found.
type confState struct {
	list *libcni.NetworkConfigList // nil when no file was usable
	file string
	err  error // why list is nil
	// plan is list as ADD uses it, with the runtime masquerade applied (masq.go).
	plan masqPlan
	// What the choice depended on: the dir's mtime (files added, removed, renamed)
	// and every file up to and including the chosen one (edits in place, and a
	// skipped broken file that gets fixed).
	dir   fileStamp
	files []fileStamp
}

func (f fileStamp) changed() bool {
	now := stamp(f.path)
	return !now.mod.Equal(f.mod) || now.size != f.size
}

func (s *confState) stale() bool {
	if s.dir.changed() {
		return true
	}
	for _, f := range s.files {
		if f.changed() {
			return true
		}
	}
	return false
}

// scan chooses the lexically first usable config, as kubelet and containerd do with
// max_conf_num=1. Broken files are skipped (and named in the error if none is usable)
// rather than taking the node's network down while someone is editing a file.
func scan(dir string) *confState {
	// Stamps are taken before reading so a change racing the read is seen next time.
	st := &confState{dir: stamp(dir)}
	files, err := ConfigFiles(dir)
	if err != nil {
		st.err = err
		return st
	}
	var skipped []string
	for _, f := range files {
		st.files = append(st.files, stamp(f))
		list, err := LoadConfigFile(f)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("%s: %v", filepath.Base(f), err))
			continue
		}
		st.list, st.file = list, f
		return st
	}
	switch {
	case len(skipped) > 0:
		st.err = fmt.Errorf("no usable CNI network config in %s (%s)", dir, strings.Join(skipped, "; "))
	default:
		st.err = fmt.Errorf("no CNI network config (*.conflist, *.conf, *.json) in %s", dir)
	}
	return st
}
