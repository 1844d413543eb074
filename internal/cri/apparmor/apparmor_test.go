package apparmor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoaded(t *testing.T) {
	list := "crisp-default (enforce)\n/usr/bin/man (enforce)\nlsb_release (enforce)\nmy profile (complain)\ncrisp-default-old (enforce)\n"
	path := filepath.Join(t.TempDir(), "profiles")
	if err := os.WriteFile(path, []byte(list), 0o644); err != nil {
		t.Fatal(err)
	}
	h := &Host{profiles: path}
	for name, want := range map[string]bool{
		"crisp-default": true,
		"/usr/bin/man":  true,
		"my profile":    true,
		"crisp":         false, // a prefix of a loaded name
		"my":            false,
		"lsb_release (": false,
		"":              false,
	} {
		got, err := h.Loaded(name)
		if err != nil || got != want {
			t.Errorf("Loaded(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	h.profiles = filepath.Join(t.TempDir(), "missing")
	if _, err := h.Loaded("x"); err == nil {
		t.Error("an unreadable profiles list was not an error")
	}
}

// TestDefaultProfileGenerates checks that containerd's template gives a profile under
// crisp's name; that the kernel accepts it is shown in the node VM (test/e2e/node_apparmor_test.go).
func TestDefaultProfileGenerates(t *testing.T) {
	p, err := dumpDefault()
	if err != nil {
		t.Fatal(err)
	}
	if want := "profile " + DefaultProfile + " flags="; !strings.Contains(p, want) {
		t.Errorf("generated profile lacks %q:\n%s", want, p)
	}
}

// BenchmarkEnsureDefault is what a container create pays for its default profile on a
// host with AppArmor (it runs in the node VM; elsewhere it skips).
func BenchmarkEnsureDefault(b *testing.B) {
	h := New(false)
	if h == nil {
		b.Skip("no AppArmor on this host")
	}
	if _, err := h.EnsureDefault(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := h.EnsureDefault(); err != nil {
			b.Fatal(err)
		}
	}
}
