package network

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfig(t *testing.T) {
	const other = `{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge","bridge":"x0"}]}`
	const single = `{"cniVersion":"1.0.0","name":"single","type":"bridge","bridge":"x0"}`
	tests := []struct {
		name      string
		existing  map[string]string // files in ConfDir before New; nil means no dir at all
		wantWrite bool
		wantNet   string
	}{
		{name: "missing dir", existing: nil, wantWrite: true, wantNet: DefaultNetworkName},
		{name: "empty dir", existing: map[string]string{}, wantWrite: true, wantNet: DefaultNetworkName},
		{name: "unrelated files only", existing: map[string]string{"README": "x", "99.conflist.bak": other}, wantWrite: true, wantNet: DefaultNetworkName},
		{name: "conflist present", existing: map[string]string{"20-other.conflist": other}, wantWrite: false, wantNet: "other"},
		{name: "single conf present", existing: map[string]string{"50-single.conf": single}, wantWrite: false, wantNet: "single"},
		{name: "json present", existing: map[string]string{"50-single.json": single}, wantWrite: false, wantNet: "single"},
		{name: "broken config present", existing: map[string]string{"00-broken.conflist": "{"}, wantWrite: false, wantNet: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			confDir := filepath.Join(t.TempDir(), "net.d")
			if tc.existing != nil {
				writeFiles(t, confDir, tc.existing)
			}
			cfg := Config{ConfDir: confDir, CacheDir: t.TempDir(), DefaultBridge: "crtdef0", DefaultSubnet: "10.222.250.0/24", IPAMDataDir: "/x/ipam", Masquerade: noMasq}
			m, err := New(cfg, testLogger(t))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if got := m.NetworkName(); got != tc.wantNet {
				t.Errorf("NetworkName = %q, want %q", got, tc.wantNet)
			}
			path := filepath.Join(confDir, DefaultConfName)
			fi, err := os.Stat(path)
			if !tc.wantWrite {
				if err == nil {
					t.Fatalf("%s written although a config existed", DefaultConfName)
				}
				return
			}
			if err != nil {
				t.Fatalf("default config not written: %v", err)
			}
			if fi.Mode().Perm() != 0o644 {
				t.Errorf("mode = %v, want 0644", fi.Mode().Perm())
			}
			entries, _ := os.ReadDir(confDir)
			for _, e := range entries {
				if strings.HasSuffix(e.Name(), ".tmp") {
					t.Errorf("temp file left: %s", e.Name())
				}
			}
			checkDefaultConf(t, path, cfg)
		})
	}
}

func checkDefaultConf(t *testing.T, path string, cfg Config) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		CNIVersion string `json:"cniVersion"`
		Name       string
		Plugins    []struct {
			Type         string
			Bridge       string
			IsGateway    bool
			IPMasq       bool
			HairpinMode  bool
			Capabilities map[string]bool
			SNAT         *bool
			IPAM         struct {
				Type    string
				Ranges  [][]struct{ Subnet string }
				Routes  []struct{ Dst string }
				DataDir string
			}
		}
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("default config is not JSON: %v", err)
	}
	if c.CNIVersion != "1.0.0" || c.Name != DefaultNetworkName || len(c.Plugins) != 2 {
		t.Fatalf("default config = %s", data)
	}
	br, pm := c.Plugins[0], c.Plugins[1]
	if br.Type != "bridge" || br.Bridge != cfg.DefaultBridge || !br.IsGateway || !br.IPMasq || !br.HairpinMode {
		t.Errorf("bridge plugin = %+v", br)
	}
	if br.IPAM.Type != "host-local" || br.IPAM.DataDir != cfg.IPAMDataDir || len(br.IPAM.Ranges) != 1 ||
		br.IPAM.Ranges[0][0].Subnet != cfg.DefaultSubnet || len(br.IPAM.Routes) != 1 || br.IPAM.Routes[0].Dst != "0.0.0.0/0" {
		t.Errorf("ipam = %+v", br.IPAM)
	}
	if pm.Type != "portmap" || !pm.Capabilities["portMappings"] || pm.SNAT == nil || !*pm.SNAT {
		t.Errorf("portmap plugin = %+v", pm)
	}
}

func TestNewRejectsBadDefaults(t *testing.T) {
	tests := []struct{ name, bridge, subnet, want string }{
		{"bad subnet", "crt0", "10.222.0.0", "default subnet"},
		{"long bridge", "this-is-too-long0", "10.222.0.0/24", "at most 15"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := New(Config{ConfDir: dir, CacheDir: t.TempDir(), DefaultBridge: tc.bridge, DefaultSubnet: tc.subnet, Masquerade: noMasq}, testLogger(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New err = %v, want %q", err, tc.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Fatalf("files left: %v", entries)
			}
		})
	}
}

func TestConfigReload(t *testing.T) {
	confDir := t.TempDir()
	m, err := New(Config{ConfDir: confDir, CacheDir: t.TempDir(), DefaultBridge: "crtdef0", DefaultSubnet: "10.222.250.0/24", Masquerade: noMasq}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	conf := func(name string) string {
		return `{"cniVersion":"1.0.0","name":"` + name + `","plugins":[{"type":"bridge"}]}`
	}
	// Each step bumps mtimes explicitly, so the test does not depend on the
	// filesystem's timestamp granularity.
	tick := time.Now()
	touch := func(paths ...string) {
		tick = tick.Add(time.Second)
		for _, p := range paths {
			if err := os.Chtimes(p, tick, tick); err != nil {
				t.Fatal(err)
			}
		}
	}
	first := filepath.Join(confDir, "05-first.conflist")
	broken := filepath.Join(confDir, "01-broken.conflist")
	steps := []struct {
		name   string
		change func()
		want   string
	}{
		{"default", func() {}, DefaultNetworkName},
		{"lexically earlier file dropped in", func() { writeFiles(t, confDir, map[string]string{"05-first.conflist": conf("first")}); touch(confDir) }, "first"},
		{"edited in place", func() { writeFiles(t, confDir, map[string]string{"05-first.conflist": conf("edited")}); touch(first) }, "edited"},
		{"broken earlier file skipped", func() { writeFiles(t, confDir, map[string]string{"01-broken.conflist": "{"}); touch(confDir) }, "edited"},
		{"broken file fixed in place", func() { writeFiles(t, confDir, map[string]string{"01-broken.conflist": conf("fixed")}); touch(broken) }, "fixed"},
		{"files removed", func() { os.Remove(broken); os.Remove(first); touch(confDir) }, DefaultNetworkName},
		{"all removed", func() { os.Remove(filepath.Join(confDir, DefaultConfName)); touch(confDir) }, ""},
	}
	for _, s := range steps {
		s.change()
		if got := m.NetworkName(); got != s.want {
			t.Fatalf("after %s: NetworkName = %q, want %q", s.name, got, s.want)
		}
	}
	err = m.Ready()
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "no CNI network config") {
		t.Fatalf("Ready with no config = %v", err)
	}
}

func TestReady(t *testing.T) {
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Skip("needs Debian's containernetworking-plugins in /usr/lib/cni")
	}
	emptyBin := t.TempDir()
	tests := []struct {
		name    string
		files   map[string]string // nil: the default config
		binDirs []string
		want    []string // substrings of the error; nil means ready
	}{
		{name: "default config, plugins installed", binDirs: []string{"/usr/lib/cni"}},
		{name: "later bin dir", binDirs: []string{emptyBin, "/usr/lib/cni"}},
		{name: "no plugins", binDirs: []string{emptyBin}, want: []string{"bridge, host-local, portmap", emptyBin, DefaultConfName}},
		{
			name:    "one plugin missing",
			files:   map[string]string{"10-x.conflist": `{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"bridge","ipam":{"type":"nosuch-ipam"}},{"type":"portmap"}]}`},
			binDirs: []string{"/usr/lib/cni"},
			want:    []string{`network "x"`, "nosuch-ipam", "/usr/lib/cni"},
		},
		{
			name:    "plugin list with the wrong extension",
			files:   map[string]string{"10-x.conf": `{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"bridge"}]}`},
			binDirs: []string{"/usr/lib/cni"},
			want:    []string{"10-x.conf", "must be named *.conflist"},
		},
		{
			name:    "only a broken config",
			files:   map[string]string{"10-x.conflist": `{"name":"x","plugins":[]}`},
			binDirs: []string{"/usr/lib/cni"},
			want:    []string{"10-x.conflist", "no plugins in list"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			confDir := t.TempDir()
			writeFiles(t, confDir, tc.files)
			m, err := New(Config{ConfDir: confDir, BinDirs: tc.binDirs, CacheDir: t.TempDir(), DefaultBridge: "crtdef0", DefaultSubnet: "10.222.250.0/24", Masquerade: noMasq}, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			err = m.Ready()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Ready = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrNotReady) {
				t.Fatalf("Ready = %v, want ErrNotReady", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Ready error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// noMasq keeps the tests of config handling from installing masquerade rules in the
// host's real nat chain: with "plugin" crisp only lists it.
const noMasq = MasqueradePlugin

func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
