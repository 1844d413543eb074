package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

// nodeCritestSkips are the specs critest cannot run in the node VM, with the reason;
// they are skipped there on top of critestSkips.
var nodeCritestSkips = []struct{ spec, why string }{
	{"when Host idmap mount support is needed runtime should support NamespaceMode_POD",
		"critest skips it itself unless the host's /run, a tmpfs, takes idmapped mounts, and Debian 12's " +
			"6.1 kernel cannot idmap a tmpfs (6.3 can); crisp's user-namespaced pods are tested in the guest " +
			"by TestNodeUserNamespace"},
}

// Where hack/nodevm/test-node.sh puts critest and its images for TestNodeCritest (the
// guest has no compiler and no internet): node-run.sh copies both from the share into
// the directory node.test runs in.
const (
	nodeCritestBinary = "critest"
	nodeCritestImages = "critest-images"
	// critestImagesExportEnv names the directory TestCritestImagesExport writes to.
	critestImagesExportEnv = "CRISP_CRITEST_IMAGES_EXPORT"
	// ociRefName is the OCI image layout's annotation for an image's reference.
	ociRefName = "org.opencontainers.image.ref.name"
)

// TestCritestImagesExport writes critestImages as an OCI image layout, each image
// annotated with its reference below the mirrored registries, to the directory
// CRISP_CRITEST_IMAGES_EXPORT names. test-node.sh runs it on the host, where gcc and
// busybox-static are, for TestNodeCritest in the guest; skipped without the variable.
func TestCritestImagesExport(t *testing.T) {
	dir := os.Getenv(critestImagesExportEnv)
	if dir == "" {
		t.Skip(critestImagesExportEnv + " names no directory: nothing to export (test-node.sh sets it)")
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatalf("critest images: %v", err)
	}
	for ref, img := range critestImages(t) {
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{ociRefName: ref})); err != nil {
			t.Fatalf("critest images: append %s: %v", ref, err)
		}
	}
}

// pushCritestImages pushes the images of the OCI layout at dir (TestCritestImagesExport)
// to the registry at host under their references.
func pushCritestImages(t *testing.T, dir, host string) {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("critest images (test-node.sh exports them into the share): %v", err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range m.Manifests {
		ref := d.Annotations[ociRefName]
		if ref == "" {
			t.Fatalf("critest images: %s has no %s annotation", d.Digest, ociRefName)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatalf("critest images: %s: %v", ref, err)
		}
		imagetest.Push(t, host, ref, img)
	}
	if len(m.Manifests) == 0 {
		t.Fatalf("critest images: %s holds none", dir)
	}
}

// nodeMirror makes the installed crisp pull each of upstreams from mirror (the
// [registry.mirrors] of /etc/crisp/config.toml) and restarts it; the config as it was
// comes back, with a restart, when the test ends.
func (e *env) nodeMirror(mirror string, upstreams []string) {
	e.t.Helper()
	e.editNodeConfig(func(cfg map[string]any) {
		reg, _ := cfg["registry"].(map[string]any)
		if reg == nil {
			reg = map[string]any{}
			cfg["registry"] = reg
		}
		mirrors, _ := reg["mirrors"].(map[string]any)
		if mirrors == nil {
			mirrors = map[string]any{}
			reg["mirrors"] = mirrors
		}
		for _, up := range upstreams {
			mirrors[up] = []string{mirror}
		}
	})
}

// nodeCritestRun is one critest run of TestNodeCritest.
type nodeCritestRun struct {
	name  string
	focus string // --ginkgo.focus
	skip  string // --ginkgo.skip, besides critestSkips and nodeCritestSkips
	// must is a string some of the run's specs' names contain: a run without such a
	// spec fails.
	must string
}

// nodeCritestRuns are the runs this guest makes: the SELinux specs where SELinux is on
// (/sys/fs/selinux/enforce), the AppArmor specs where AppArmor is, and under the
// systemd driver the rest of the suite in the AppArmor guest.
func nodeCritestRuns() []nodeCritestRun {
	var runs []nodeCritestRun
	selinux := exists("/sys/fs/selinux/enforce")
	if selinux {
		runs = append(runs, nodeCritestRun{name: "SELinux", focus: "SELinux", must: "SELinux"})
	}
	if exists("/sys/kernel/security/apparmor/profiles") {
		runs = append(runs, nodeCritestRun{name: "AppArmor", focus: "AppArmor", must: "AppArmor"})
	}
	if nodeDriver() == "systemd" && !selinux {
		runs = append(runs, nodeCritestRun{name: "rest", skip: "AppArmor|SELinux"})
	}
	return runs
}

// TestNodeCritest runs critest, the CRI validation suite of cri-tools, against the
// installed crisp service: in the AppArmor guest its AppArmor specs under either
// driver and, under the systemd driver, the rest of the suite too; in an SELinux guest
// its SELinux specs. critest's images are TestE2EContainerdCritest's stand-ins, built on
// the host (TestCritestImagesExport) and served from a registry in this test that the
// service takes as the mirror of critest's registries. Every spec must pass (none may
// skip itself) but those critestSkips and nodeCritestSkips name; the counts and every
// spec that did not pass are logged, critest's output and report kept in the guest's
// out/ directory.
func TestNodeCritest(t *testing.T) {
	e := newNodeEnv(t)
	critest, err := filepath.Abs(nodeCritestBinary)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(critest); err != nil {
		t.Fatalf("critest: %v (hack/nodevm/test-node.sh puts it into the share)", err)
	}
	host := imagetest.StartRegistry(t)
	pushCritestImages(t, nodeCritestImages, host)
	e.nodeMirror("http://"+host, critestUpstreams)

	out := os.Getenv("NODEVM_OUT")
	if out == "" {
		out = e.dir
	}
	crictl := filepath.Join(e.dir, "crictl.yaml")
	endpoint := "unix://" + nodeSocket
	if err := os.WriteFile(crictl, []byte(fmt.Sprintf("runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: 30\n", endpoint, endpoint)), 0o644); err != nil {
		t.Fatal(err)
	}
	// critest loads its AppArmor profiles with `sudo apparmor_parser`; a node has no sudo
	// (Debian's minbase, the guest), and the test runs as root, what sudo would make it.
	bin := filepath.Join(e.dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "sudo"), []byte("#!/bin/sh\nexec \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + bin + ":" + os.Getenv("PATH")}
	skips := append(append(critestSkips[:0:0], critestSkips...), nodeCritestSkips...)
	for _, r := range nodeCritestRuns() {
		t.Run(r.name, func(t *testing.T) {
			args := []string{
				"--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--config", crictl,
				"--ginkgo.no-color", "--ginkgo.timeout", critestTimeout(t).String(),
				"--ginkgo.json-report", filepath.Join(out, "critest-"+r.name+".json"),
			}
			if r.skip != "" {
				args = append(args, "--ginkgo.skip", r.skip)
			}
			if r.focus != "" {
				args = append(args, "--ginkgo.focus", r.focus)
			}
			start := time.Now()
			res := execCritest(t, critest, e.dir, args, skips, env,
				filepath.Join(out, "critest-"+r.name+".log"), filepath.Join(out, "critest-"+r.name+".json"))
			logCritestResults(t, fmt.Sprintf("%s (%s driver)", r.name, nodeDriver()), res, time.Since(start))
			checkNodeCritest(t, r, res)
		})
	}
}

// critestTimeout is what critest may take: the test binary's time left but a minute,
// so that critest writes its report before the binary's timeout ends the test.
func critestTimeout(t *testing.T) time.Duration {
	d, ok := t.Deadline()
	if !ok {
		return time.Hour
	}
	left := time.Until(d) - time.Minute
	if left < time.Minute {
		t.Fatalf("%v left of the test's timeout: too little for critest", time.Until(d).Round(time.Second))
	}
	return left.Round(time.Second)
}

// checkNodeCritest fails t for every spec of res that failed or skipped itself, and
// when none of r.must's specs ran.
func checkNodeCritest(t *testing.T, r nodeCritestRun, res map[string]critestSpec) {
	t.Helper()
	must := 0
	for _, name := range sortedSpecs(res) {
		s := res[name]
		k := s.kind()
		if r.must != "" && strings.Contains(name, r.must) && k != "not selected" && k != "excluded" {
			must++
		}
		// A spec that skips itself found the node lacking: either it is listed, with the
		// reason, in nodeCritestSkips, or the node has to change.
		if k == "failed" || k == "skipped" {
			t.Errorf("critest %s: %s\n      %s", k, name, s.reason())
		}
	}
	if r.must != "" && must == 0 {
		t.Errorf("critest ran no %s spec", r.must)
	}
}
