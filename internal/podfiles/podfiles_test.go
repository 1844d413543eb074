package podfiles

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

func TestResolvConf(t *testing.T) {
	got, err := ResolvConf(DNS{Servers: []string{"1.1.1.1", "8.8.8.8"}, Searches: []string{"a.local"}, Options: []string{"ndots:5", "edns0"}})
	if err != nil {
		t.Fatal(err)
	}
	want := "search a.local\nnameserver 1.1.1.1\nnameserver 8.8.8.8\noptions ndots:5 edns0\n"
	if string(got) != want {
		t.Fatalf("got %q want %q", got, want)
	}
}

func TestWrite(t *testing.T) {
	hostHosts, _ := os.ReadFile("/etc/hosts")
	for _, tc := range []struct {
		name      string
		pod       Pod
		wantHosts string
	}{
		{"pod network", Pod{Hostname: "web", IP: "10.1.2.3", DNS: DNS{Servers: []string{"10.0.0.10"}}},
			"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n10.1.2.3\tweb\n"},
		{"no ip known", Pod{Hostname: "web", DNS: DNS{Servers: []string{"10.0.0.10"}}},
			"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"},
		{"host network", Pod{Hostname: "node", HostNetwork: true, DNS: DNS{Servers: []string{"10.0.0.10"}}}, string(hostHosts)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pod")
			if err := Write(dir, tc.pod); err != nil {
				t.Fatal(err)
			}
			for file, want := range map[string]string{
				HostnameFile: tc.pod.Hostname + "\n",
				HostsFile:    tc.wantHosts,
				ResolvFile:   "nameserver 10.0.0.10\n",
			} {
				got, err := os.ReadFile(filepath.Join(dir, file))
				if err != nil || string(got) != want {
					t.Errorf("%s = %q, %v; want %q", file, got, err, want)
				}
			}
			if err := Remove(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("%s left after Remove: %v", dir, err)
			}
		})
	}
}

func TestShmMountAndRemove(t *testing.T) {
	testutil.RequiresRoot(t, "mounts a tmpfs")
	dir := t.TempDir()
	shm := filepath.Join(dir, ShmDir)
	if err := MountShm(shm, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shm, "seg"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left after Remove: %v", dir, err)
	}
	if err := Remove(dir); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

// TestResolvConfRefuses: a DNS config ResolvConf takes is one whose every server,
// search and option stays on its own line, within kubelet's limits; what would add a
// line of its own (an option "ndots:5\nnameserver 203.0.113.9") or go past them is
// refused, on every path that writes a resolv.conf.
func TestResolvConfRefuses(t *testing.T) {
	many := func(n int, f func(i int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	ok := []DNS{
		{Servers: []string{"10.0.0.10", "fd00::10", "10.0.0.11"}},
		{Searches: many(32, func(i int) string { return fmt.Sprintf("s%d.example", i) })},
		// 2048 characters with the spaces: kubelet's longest search line.
		{Options: []string{"ndots:5", "edns0", "timeout:1", "attempts:2", "single-request-reopen", strings.Repeat("o", 255)}},
		{Searches: append(many(7, func(int) string { return strings.Repeat("a", 255) }), strings.Repeat("b", 2048-7*256))},
		{Options: many(64, func(i int) string { return fmt.Sprintf("opt%d", i) })},
	}
	for _, dns := range ok {
		if _, err := ResolvConf(dns); err != nil {
			t.Errorf("ResolvConf(%+v): %v", dns, err)
		}
	}
	for _, tc := range []struct {
		name string
		dns  DNS
		want string
	}{
		{"option with a line break", DNS{Servers: []string{"10.0.0.10"}, Options: []string{"ndots:5\nnameserver 203.0.113.9"}}, `dns_config.options[0] "ndots:5\nnameserver 203.0.113.9"`},
		{"search with a line break", DNS{Searches: []string{"svc.local\nnameserver 203.0.113.9"}}, "dns_config.searches[0]"},
		{"search with a carriage return", DNS{Searches: []string{"a.local\rb"}}, "dns_config.searches[0]"},
		{"search with a tab", DNS{Searches: []string{"a.local\tb.local"}}, "dns_config.searches[0]"},
		{"option with a space", DNS{Options: []string{"ndots:5 rotate"}}, "dns_config.options[0]"},
		{"option with NUL", DNS{Options: []string{"ndots:5\x00"}}, "dns_config.options[0]"},
		{"empty search", DNS{Searches: []string{"a.local", ""}}, "dns_config.searches[1]"},
		{"server not an IP", DNS{Servers: []string{"dns.example"}}, `dns_config.servers[0] "dns.example" is not an IP address`},
		{"server with a line break", DNS{Servers: []string{"10.0.0.10\nsearch evil"}}, "dns_config.servers[0]"},
		{"four servers", DNS{Servers: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}}, "4 servers, at most 3"},
		{"33 searches", DNS{Searches: many(33, func(i int) string { return fmt.Sprintf("s%d.example", i) })}, "33 domains, at most 32"},
		{"search line too long", DNS{Searches: append(many(7, func(int) string { return strings.Repeat("a", 255) }), strings.Repeat("b", 2049-7*256))}, "2049 characters"},
		{"65 options", DNS{Options: many(65, func(i int) string { return fmt.Sprintf("opt%d", i) })}, "65 options, at most 64"},
		{"long option", DNS{Options: []string{strings.Repeat("o", 256)}}, "dns_config.options[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolvConf(tc.dns)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("ResolvConf = %q, %v; want an InvalidArgument error containing %q", got, err, tc.want)
			}
		})
	}
}

// TestWriteRefuses: Write writes no line break it did not put there itself, and
// nothing at all for a pod it refuses.
func TestWriteRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  Pod
		want string
	}{
		{"hostname with a line break", Pod{Hostname: "web\n203.0.113.9\tevil", IP: "10.1.2.3"}, "hostname"},
		{"hostname with a tab", Pod{Hostname: "web\tevil", IP: "10.1.2.3"}, "hostname"},
		{"hostname with a slash", Pod{Hostname: "a/b"}, "hostname"},
		{"hostname too long", Pod{Hostname: strings.Repeat("h", 65)}, "hostname"},
		{"ip not an IP", Pod{Hostname: "web", IP: "10.1.2.3\n203.0.113.9 evil"}, "IP"},
		{"dns option with a line break", Pod{Hostname: "web", DNS: DNS{Options: []string{"ndots:5\nnameserver 203.0.113.9"}}}, "dns_config.options[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pod")
			err := Write(dir, tc.pod)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errdefs.IsInvalidArgument(err) {
				t.Errorf("Write = %v; want an InvalidArgument error containing %q", err, tc.want)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("Write made %s for a pod it refuses (%v)", dir, err)
			}
		})
	}
}
