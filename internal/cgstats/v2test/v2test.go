// Package v2test builds directory trees in the file layout of a cgroup v2 (unified)
// node, so that crisp's v2 code paths (stats, OOM watch, resource files) can be tested
// on a host that is cgroup v1 or hybrid, and without root. Only tests import it.
//
// The files are plain files with the contents the kernel shows; nothing here behaves
// like cgroupfs (writes do not validate, reads of memory.events do not change by
// themselves), so a test writes the kernel's side of the story itself.
package v2test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Controllers is what cgroup.controllers lists on a typical v2 node (kernel 6.1+ with
// every controller kubelet uses enabled).
const Controllers = "cpuset cpu io memory hugetlb pids rdma misc"

// Node is the root of a fake unified hierarchy (what /sys/fs/cgroup is on a v2 node).
type Node struct {
	t    testing.TB
	Root string
}

// New makes an empty v2 root in a temp dir: cgroup.controllers, cgroup.subtree_control
// (every controller delegated, as systemd and kubelet leave it), cgroup.procs.
func New(t testing.TB) *Node {
	t.Helper()
	n := &Node{t: t, Root: t.TempDir()}
	n.writeCgroupFiles(n.Root)
	return n
}

func (n *Node) writeCgroupFiles(dir string) {
	n.t.Helper()
	n.Write(dir, map[string]string{
		"cgroup.controllers":     Controllers + "\n",
		"cgroup.subtree_control": Controllers + "\n",
		"cgroup.procs":           "",
		"cgroup.type":            "domain\n",
	})
}

// Mkdir makes the cgroup rel (e.g. /kubepods.slice/kubepods-burstable.slice/x.scope)
// and every missing parent, each with the files every v2 cgroup has. It returns the
// cgroup's directory.
func (n *Node) Mkdir(rel string) string {
	n.t.Helper()
	dir := n.Root
	for _, part := range strings.Split(strings.Trim(rel, "/"), "/") {
		if part == "" {
			continue
		}
		dir = filepath.Join(dir, part)
		if _, err := os.Stat(dir); err == nil {
			continue
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			n.t.Fatal(err)
		}
		n.writeCgroupFiles(dir)
	}
	return dir
}

// Write writes files (name → content) into dir.
func (n *Node) Write(dir string, files map[string]string) {
	n.t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			n.t.Fatal(err)
		}
	}
}

// Read returns the content of dir/name with surrounding white space trimmed; "" when
// the file does not exist.
func (n *Node) Read(dir, name string) string {
	n.t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if os.IsNotExist(err) {
		return ""
	}
	if err != nil {
		n.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// Busy is a container cgroup's files as a v2 kernel shows them for a container with
// a 256 MiB memory limit, 64 MiB of swap, half a CPU, a 1024 pids limit and some I/O,
// with the values the tests check. Memory: 100 MiB charged, 30 MiB of it inactive file
// cache (working set 70 MiB), 8 MiB swapped out, one OOM kill. CPU: 100 CFS periods, 5
// of them throttled for 12.345 ms. PSI in cpu, memory and io.pressure.
var Busy = map[string]string{
	"memory.current": "104857600\n",
	"memory.max":     "268435456\n",
	"memory.peak":    "134217728\n",
	"memory.stat": "anon 62914560\nfile 41943040\nkernel_stack 98304\nslab 1048576\nsock 0\nshmem 0\n" +
		"file_mapped 4194304\nfile_dirty 0\nfile_writeback 0\nanon_thp 0\ninactive_anon 0\nactive_anon 62914560\n" +
		"inactive_file 31457280\nactive_file 10485760\nunevictable 0\nslab_reclaimable 524288\n" +
		"slab_unreclaimable 524288\npgfault 1000\npgmajfault 7\nworkingset_refault_anon 0\n",
	"memory.events":       "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n",
	"memory.swap.current": "8388608\n",
	"memory.swap.max":     "67108864\n",
	"memory.pressure":     "some avg10=0.00 avg60=0.00 avg300=0.00 total=1500\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=700\n",
	"cpu.max":             "50000 100000\n",
	"cpu.weight":          "39\n",
	"cpu.stat": "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 100\n" +
		"nr_throttled 5\nthrottled_usec 12345\nnr_bursts 0\nburst_usec 0\n",
	"cpu.pressure":        "some avg10=1.50 avg60=0.50 avg300=0.10 total=2000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=900\n",
	"io.pressure":         "some avg10=0.25 avg60=0.05 avg300=0.01 total=3000\nfull avg10=0.20 avg60=0.04 avg300=0.01 total=2500\n",
	"io.stat":             "8:0 rbytes=1048576 wbytes=4096 rios=10 wios=1 dbytes=0 dios=0\n253:1 rbytes=512 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n",
	"pids.current":        "3\n",
	"pids.max":            "1024\n",
	"hugetlb.2MB.current": "0\n",
	"hugetlb.2MB.max":     "4194304\n",
	"hugetlb.2MB.events":  "max 0\n",
	"hugetlb.1GB.current": "0\n",
	"hugetlb.1GB.max":     "max\n",
	"hugetlb.1GB.events":  "max 0\n",
}
