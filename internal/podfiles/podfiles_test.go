package podfiles

import (
	"os"
	"path/filepath"
	"testing"

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
	if err := MountShm(shm); err != nil {
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
