package network

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParsePodCIDRs(t *testing.T) {
	tests := []struct {
		in   string
		want string // canonical form; "" means an error
	}{
		{"10.244.1.0/24", "10.244.1.0/24"},
		{"10.244.1.7/24", "10.244.1.0/24"}, // host bits cleared
		{"fd00:10:244:1::/64", "fd00:10:244:1::/64"},
		{"10.244.1.0/24,fd00:10:244:1::/64", "10.244.1.0/24,fd00:10:244:1::/64"},
		{" 10.244.1.0/24 , fd00::/64", "10.244.1.0/24,fd00::/64"},
		{"10.244.1.0/30", "10.244.1.0/30"},
		{"", ""},
		{"garbage", ""},
		{"10.244.1.0", ""},
		{"10.244.1.0/33", ""},
		{"10.244.1.0/31", ""},
		{"10.244.1.0/24,10.245.1.0/24", ""},
		{"127.0.0.0/8", ""},
		{"0.0.0.0/0", ""},
		{"224.0.0.0/4", ""},
		{"fe80::/64", ""},
		{"10.244.1.0/24,", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			nets, err := ParsePodCIDRs(tc.in)
			if tc.want == "" {
				if err == nil || !errors.Is(err, ErrInvalidPodCIDR) {
					t.Fatalf("ParsePodCIDRs(%q) = %v, %v; want ErrInvalidPodCIDR", tc.in, nets, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := joinCIDRs(nets); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func newPodCIDRManager(t *testing.T, confDir, stateDir, subnet string) *Manager {
	t.Helper()
	m, err := New(Config{ConfDir: confDir, CacheDir: filepath.Join(stateDir, "cache"), DefaultBridge: "crtdef0",
		DefaultSubnet: subnet, IPAMDataDir: "/x/ipam", Masquerade: noMasq}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestSetPodCIDRRewritesOwnDefault(t *testing.T) {
	confDir, stateDir := t.TempDir(), t.TempDir()
	own := filepath.Join(confDir, DefaultConfName)
	m := newPodCIDRManager(t, confDir, stateDir, "10.222.250.0/24")

	res, err := m.SetPodCIDR("10.222.7.9/24")
	if err != nil {
		t.Fatal(err)
	}
	if res.PodCIDR != "10.222.7.0/24" || !res.Changed || !res.Applied || res.ActiveFile != own {
		t.Fatalf("result %+v", res)
	}
	if got := subnetsOf([]byte(readFile(t, own))); got != "10.222.7.0/24" {
		t.Fatalf("default config subnet %q", got)
	}
	// The manager uses it at once.
	list, _, err := m.current()
	if err != nil || subnetsOf(list.Bytes) != "10.222.7.0/24" {
		t.Fatalf("current config: %v %s", err, list.Bytes)
	}
	// Same again: nothing changes.
	if res, err := m.SetPodCIDR("10.222.7.0/24"); err != nil || res.Changed || !res.Applied {
		t.Fatalf("repeat: %+v %v", res, err)
	}
	// Dual stack.
	if res, err := m.SetPodCIDR("10.222.8.0/24,fd00:222:8::/64"); err != nil || !res.Applied {
		t.Fatalf("dual stack: %+v %v", res, err)
	}
	if got := subnetsOf([]byte(readFile(t, own))); got != "10.222.8.0/24,fd00:222:8::/64" {
		t.Fatalf("dual-stack subnets %q", got)
	}

	// A restart with the configured default keeps kubelet's CIDR.
	m2 := newPodCIDRManager(t, confDir, stateDir, "10.222.250.0/24")
	if got := subnetsOf([]byte(readFile(t, own))); got != "10.222.8.0/24,fd00:222:8::/64" {
		t.Fatalf("after restart the default config has %q", got)
	}
	if m2.cfg.DefaultSubnet != "10.222.8.0/24,fd00:222:8::/64" {
		t.Fatalf("after restart DefaultSubnet %q", m2.cfg.DefaultSubnet)
	}
}

func TestSetPodCIDRBadInputChangesNothing(t *testing.T) {
	confDir, stateDir := t.TempDir(), t.TempDir()
	own := filepath.Join(confDir, DefaultConfName)
	m := newPodCIDRManager(t, confDir, stateDir, "10.222.250.0/24")
	before := readFile(t, own)
	if _, err := m.SetPodCIDR("10.0.0.0/8/8"); !errors.Is(err, ErrInvalidPodCIDR) || !strings.Contains(err.Error(), "10.244.1.0/24") {
		t.Fatalf("bad CIDR: %v (want an example of a good one in the message)", err)
	}
	if readFile(t, own) != before {
		t.Fatal("default config changed by a rejected CIDR")
	}
	if _, err := os.Stat(filepath.Join(stateDir, "pod-cidr")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("rejected CIDR was kept: %v", err)
	}
}

func TestSetPodCIDRLeavesOperatorConfigs(t *testing.T) {
	const operator = `{"cniVersion":"1.0.0","name":"cluster","plugins":[{"type":"bridge","bridge":"x0","ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/16"}]]}}]}`
	t.Run("operator config in use", func(t *testing.T) {
		confDir, stateDir := t.TempDir(), t.TempDir()
		writeFiles(t, confDir, map[string]string{"10-cluster.conflist": operator})
		m := newPodCIDRManager(t, confDir, stateDir, "10.222.250.0/24")
		res, err := m.SetPodCIDR("10.222.9.0/24")
		if err != nil {
			t.Fatal(err)
		}
		if res.Applied || res.ActiveFile != filepath.Join(confDir, "10-cluster.conflist") {
			t.Fatalf("result %+v", res)
		}
		if readFile(t, filepath.Join(confDir, "10-cluster.conflist")) != operator {
			t.Fatal("operator config rewritten")
		}
		if _, err := os.Stat(filepath.Join(confDir, DefaultConfName)); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("crisp wrote its default next to an operator config")
		}
		// Kept for when crisp's default network is used again.
		if got := strings.TrimSpace(readFile(t, filepath.Join(stateDir, "pod-cidr"))); got != "10.222.9.0/24" {
			t.Fatalf("kept pod CIDR %q", got)
		}
	})
	t.Run("edited default config", func(t *testing.T) {
		confDir, stateDir := t.TempDir(), t.TempDir()
		own := filepath.Join(confDir, DefaultConfName)
		newPodCIDRManager(t, confDir, stateDir, "10.222.250.0/24")
		edited := strings.Replace(readFile(t, own), `"hairpinMode": true`, `"hairpinMode": false`, 1)
		if err := os.WriteFile(own, []byte(edited), 0o644); err != nil {
			t.Fatal(err)
		}
		m := newPodCIDRManager(t, confDir, stateDir, "10.222.250.0/24")
		res, err := m.SetPodCIDR("10.222.10.0/24")
		if err != nil {
			t.Fatal(err)
		}
		if res.Applied || readFile(t, own) != edited {
			t.Fatalf("edited default config rewritten: %+v", res)
		}
	})
}
